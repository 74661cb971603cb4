//! Plan tables of `ca_rotation`: every phase and every point a controller may be killed at.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
use super::*;

const O: &str = "old";
const N: &str = "new";

fn ts(text: &str) -> Timestamp {
    text.parse().unwrap()
}

fn bundle(rank: u8) -> Option<Bundle> {
    Some(Bundle::of_rank(rank, O, N))
}

/// Three members at `ranks`, each signed by its bundle's signer.
fn members(ranks: [u8; 3]) -> Vec<MemberCa> {
    ranks
        .iter()
        .enumerate()
        .map(|(i, rank)| MemberCa {
            machine: format!("m{i}"),
            bundle: bundle(*rank),
            signed_by: bundle(*rank).and_then(|b| b.signer().map(str::to_string)),
        })
        .collect()
}

/// The control plane as created: trusting the old CA, its client certificate from it.
fn control_plane() -> ControlPlaneCa {
    ControlPlaneCa {
        kcp: "cp".into(),
        trusted: vec![O.into()],
        client_signed_by: Some(O.into()),
        client_reissued: None,
        rollout_after: None,
        rollout_complete: true,
    }
}

/// The control plane once handed both CAs and rolled.
fn control_plane_rolled() -> ControlPlaneCa {
    ControlPlaneCa {
        trusted: vec![O.into(), N.into()],
        client_signed_by: Some(N.into()),
        client_reissued: Some(ts("2026-03-01T12:00:00Z")),
        rollout_after: Some(ts("2026-03-01T12:00:00Z")),
        ..control_plane()
    }
}

/// A settled three-member cluster on the old CA, asked to rotate with request "r1".
fn asked() -> RotationView {
    RotationView {
        request: Some("r1".into()),
        current: O.into(),
        rotated_for: None,
        next: NextCa::Missing,
        members: members([0, 0, 0]),
        control_plane: Some(control_plane()),
        settled: true,
        busy: None,
        bottlerocket: false,
    }
}

/// `asked()` with the next CA made for "r1" and the members at `ranks`.
fn rotating(ranks: [u8; 3]) -> RotationView {
    RotationView {
        next: NextCa::Present {
            fingerprint: N.into(),
            request: "r1".into(),
        },
        members: members(ranks),
        ..asked()
    }
}

fn step(v: &RotationView) -> RotationStep {
    match decide(v) {
        Some(Decision::Do(step)) => step,
        other => panic!("expected a step, got {other:?}"),
    }
}

fn hold(v: &RotationView) -> Hold {
    match decide(v) {
        Some(Decision::Hold(hold)) => hold,
        other => panic!("expected a hold, got {other:?}"),
    }
}

fn roll(phase: Phase, rank: u8, outdated: &[&str]) -> RotationStep {
    RotationStep::Roll {
        phase,
        target: Bundle::of_rank(rank, O, N),
        outdated: outdated.iter().map(|m| m.to_string()).collect(),
    }
}

#[test]
fn bundles_rank_in_the_order_members_reach_each_other() {
    assert_eq!(Bundle::of_rank(0, O, N).0, [O]);
    assert_eq!(Bundle::of_rank(1, O, N).0, [O, N]);
    assert_eq!(Bundle::of_rank(2, O, N).0, [N, O]);
    assert_eq!(Bundle::of_rank(3, O, N).0, [N]);
    for rank in 0..4 {
        assert_eq!(Bundle::of_rank(rank, O, N).rank(O, N), Some(rank));
    }
    assert_eq!(Bundle(vec!["other".into()]).rank(O, N), None);
    assert_eq!(Bundle(vec![]).rank(O, N), None);
    assert_eq!(Bundle::of_rank(2, O, N).signer(), Some(N));
    // Adjacent ranks trust each other's signer; ranks two apart do not.
    let trusts = |a: u8, b: u8| {
        let (a, b) = (Bundle::of_rank(a, O, N), Bundle::of_rank(b, O, N));
        a.0.iter().any(|f| Some(f.as_str()) == b.signer())
            && b.0.iter().any(|f| Some(f.as_str()) == a.signer())
    };
    for a in 0..4u8 {
        for b in 0..4u8 {
            assert_eq!(trusts(a, b), a.abs_diff(b) <= 1, "ranks {a} and {b}");
        }
    }
}

#[test]
fn no_request_or_one_already_served_is_idle() {
    let idle = RotationView {
        request: None,
        ..asked()
    };
    assert_eq!(phase(&idle), Phase::Idle);
    assert_eq!(decide(&idle), None);
    let empty = RotationView {
        request: Some(String::new()),
        ..asked()
    };
    assert_eq!(decide(&empty), None);
    let served = RotationView {
        rotated_for: Some("r1".into()),
        ..asked()
    };
    assert_eq!(decide(&served), None);
    assert_eq!(new_member_bundle(&served), None);
    assert_eq!(progress(&served).remaining, []);
}

/// Phase 1: the next CA is generated beside the current one, only on a settled cluster that
/// runs nothing else that replaces members, and never on Bottlerocket.
#[test]
fn a_request_generates_the_next_ca_when_nothing_else_is_under_way() {
    let v = asked();
    assert_eq!(phase(&v), Phase::Generating);
    assert_eq!(step(&v), RotationStep::CreateNextCa { request: "r1".into() });
    assert_eq!(
        new_member_bundle(&v),
        None,
        "nothing rolls before the next CA exists"
    );
    // A second request after a finished one.
    let again = RotationView {
        request: Some("r2".into()),
        rotated_for: Some("r1".into()),
        ..asked()
    };
    assert_eq!(step(&again), RotationStep::CreateNextCa { request: "r2".into() });
    let cases = [
        (
            RotationView {
                busy: Some("a restore is under way".into()),
                ..asked()
            },
            reason::CA_ROTATION_WAITING,
            false,
        ),
        (
            RotationView {
                settled: false,
                ..asked()
            },
            reason::CA_ROTATION_WAITING,
            false,
        ),
        (
            RotationView {
                bottlerocket: true,
                ..asked()
            },
            reason::CA_ROTATION_REFUSED,
            true,
        ),
    ];
    for (v, reason, refused) in cases {
        let hold = hold(&v);
        assert_eq!((hold.reason, hold.is_refusal()), (reason, refused), "{hold:?}");
    }
}

/// Phase 2: members rolled to trust both, still signed by the current CA; a crash after the
/// CA was generated, or after any replacement, resumes with the members still outdated.
#[test]
fn trusting_rolls_every_member_not_yet_trusting_both() {
    let cases: [([u8; 3], &[&str]); 3] = [
        ([0, 0, 0], &["m0", "m1", "m2"]),
        ([1, 0, 0], &["m1", "m2"]),
        ([1, 1, 0], &["m2"]),
    ];
    for (ranks, outdated) in cases {
        let v = rotating(ranks);
        assert_eq!(phase(&v), Phase::Trusting, "{ranks:?}");
        assert_eq!(step(&v), roll(Phase::Trusting, 1, outdated), "{ranks:?}");
        assert_eq!(new_member_bundle(&v), bundle(1));
    }
    // No member at all (every one replaced at once): the roll waits for members to be made.
    let empty = RotationView {
        members: vec![],
        ..rotating([0, 0, 0])
    };
    assert_eq!(step(&empty), roll(Phase::Trusting, 1, &[]));
}

/// Phase 3: once every member trusts both, the control plane is handed both CAs and a client
/// certificate from the next one, then rolled once; each write is checked before it is redone.
#[test]
fn the_control_plane_takes_both_cas_and_a_new_client_certificate_then_rolls_once() {
    let all_trust = rotating([1, 1, 1]);
    assert_eq!(phase(&all_trust), Phase::ControlPlane);
    assert_eq!(new_member_bundle(&all_trust), bundle(1));
    assert_eq!(
        step(&all_trust),
        RotationStep::HandControlPlane {
            trusted: vec![O.into(), N.into()],
            reissue_client: true,
        }
    );
    // Killed after `<cluster>-etcd` was written, before the client certificate.
    let mut half = all_trust.clone();
    half.control_plane.as_mut().unwrap().trusted = vec![O.into(), N.into()];
    assert_eq!(
        step(&half),
        RotationStep::HandControlPlane {
            trusted: vec![O.into(), N.into()],
            reissue_client: true,
        }
    );
    // Killed after both, before the rollout request.
    let reissued = ts("2026-03-01T12:00:00Z");
    let mut handed = half.clone();
    {
        let cp = handed.control_plane.as_mut().unwrap();
        cp.client_signed_by = Some(N.into());
        cp.client_reissued = Some(reissued);
        cp.rollout_after = Some(ts("2026-01-01T00:00:00Z"));
    }
    assert_eq!(
        step(&handed),
        RotationStep::RollControlPlane {
            kcp: "cp".into(),
            after: reissued,
        }
    );
    // A client certificate from the next CA without a re-issue time: issued again, so the
    // rollout has a time to follow.
    let mut unmarked = handed.clone();
    unmarked.control_plane.as_mut().unwrap().client_reissued = None;
    assert_eq!(
        step(&unmarked),
        RotationStep::HandControlPlane {
            trusted: vec![O.into(), N.into()],
            reissue_client: true,
        }
    );
    // The rollout asked for and under way: wait (no second request).
    let mut rolling = handed.clone();
    {
        let cp = rolling.control_plane.as_mut().unwrap();
        cp.rollout_after = Some(reissued);
        cp.rollout_complete = false;
    }
    assert_eq!(phase(&rolling), Phase::ControlPlane);
    let wait = hold(&rolling);
    assert_eq!(wait.reason, reason::CA_ROTATION_WAITING);
    assert!(
        wait.message.contains("KubeadmControlPlane cp"),
        "{}",
        wait.message
    );
    // Once a member of the Signing roll exists, a rollout of the control plane's own (its
    // endpoints switched mid-roll) leaves the phase at Signing, the roll going on.
    let mid_signing = RotationView {
        members: members([1, 1, 2]),
        ..rolling.clone()
    };
    assert_eq!(phase(&mid_signing), Phase::Signing);
    assert!(matches!(
        step(&mid_signing),
        RotationStep::Roll {
            phase: Phase::Signing,
            ..
        }
    ));
    // Not settled: nothing is handed yet.
    let unsettled = RotationView {
        settled: false,
        ..all_trust.clone()
    };
    assert_eq!(hold(&unsettled).reason, reason::CA_ROTATION_WAITING);
    // Without a control plane the phase is skipped.
    let alone = RotationView {
        control_plane: None,
        ..all_trust
    };
    assert_eq!(phase(&alone), Phase::Signing);
}

/// Phase 4: members signed by the next CA, trusting both, once the control plane rolled.
#[test]
fn signing_rolls_members_onto_the_next_ca_once_the_control_plane_rolled() {
    let cases: [([u8; 3], &[&str]); 3] = [
        ([1, 1, 1], &["m0", "m1", "m2"]),
        ([2, 1, 1], &["m1", "m2"]),
        ([2, 2, 1], &["m2"]),
    ];
    for (ranks, outdated) in cases {
        let v = RotationView {
            control_plane: Some(control_plane_rolled()),
            ..rotating(ranks)
        };
        assert_eq!(phase(&v), Phase::Signing, "{ranks:?}");
        assert_eq!(step(&v), roll(Phase::Signing, 2, outdated), "{ranks:?}");
        assert_eq!(new_member_bundle(&v), bundle(2));
    }
}

/// Phase 5: the old CA leaves the members' bundles.
#[test]
fn dropping_rolls_members_to_trust_the_next_ca_alone() {
    let cases: [([u8; 3], &[&str]); 3] = [
        ([2, 2, 2], &["m0", "m1", "m2"]),
        ([3, 2, 2], &["m1", "m2"]),
        ([3, 3, 2], &["m2"]),
    ];
    for (ranks, outdated) in cases {
        let v = RotationView {
            control_plane: Some(control_plane_rolled()),
            ..rotating(ranks)
        };
        assert_eq!(phase(&v), Phase::Dropping, "{ranks:?}");
        assert_eq!(step(&v), roll(Phase::Dropping, 3, outdated), "{ranks:?}");
        assert_eq!(new_member_bundle(&v), bundle(3));
    }
}

/// Phase 6: the next CA becomes the current one (marked with the request), then the control
/// plane trusts it alone and the next CA's Secret goes; killed between, it resumes.
#[test]
fn finishing_adopts_the_next_ca_then_forgets_the_old_one() {
    let done = RotationView {
        control_plane: Some(control_plane_rolled()),
        ..rotating([3, 3, 3])
    };
    assert_eq!(phase(&done), Phase::Finishing);
    assert_eq!(step(&done), RotationStep::AdoptNextCa { request: "r1".into() });
    assert_eq!(new_member_bundle(&done), bundle(3));
    let unsettled = RotationView {
        settled: false,
        ..done.clone()
    };
    assert_eq!(hold(&unsettled).reason, reason::CA_ROTATION_WAITING);
    // Killed after the adoption: the current CA is the next one, both Secrets hold it.
    let adopted = RotationView {
        current: N.into(),
        rotated_for: Some("r1".into()),
        members: vec![MemberCa {
            machine: "m0".into(),
            bundle: Some(Bundle(vec![N.into()])),
            signed_by: Some(N.into()),
        }],
        ..done.clone()
    };
    assert_eq!(phase(&adopted), Phase::Finishing);
    assert_eq!(
        new_member_bundle(&adopted),
        None,
        "the current CA alone is the next one"
    );
    assert_eq!(step(&adopted), RotationStep::ForgetOldCa { trust_new_only: true });
    // Killed after the control plane was told to trust the new CA alone.
    let mut trusted = adopted.clone();
    trusted.control_plane.as_mut().unwrap().trusted = vec![N.into()];
    assert_eq!(
        step(&trusted),
        RotationStep::ForgetOldCa {
            trust_new_only: false
        }
    );
    // Everything done: the request is served.
    let finished = RotationView {
        next: NextCa::Missing,
        ..trusted
    };
    assert_eq!(phase(&finished), Phase::Idle);
    assert_eq!(decide(&finished), None);
}

/// The request belongs to the next CA's Secret once it exists: removed or changed mid-way, the
/// rotation under way finishes with the request it began for.
#[test]
fn a_rotation_under_way_keeps_the_request_it_began_for() {
    let removed = RotationView {
        request: None,
        ..rotating([1, 0, 0])
    };
    assert_eq!(step(&removed), roll(Phase::Trusting, 1, &["m1", "m2"]));
    assert_eq!(progress(&removed).request.as_deref(), Some("r1"));
    let changed = RotationView {
        request: Some("r2".into()),
        control_plane: Some(control_plane_rolled()),
        ..rotating([3, 3, 3])
    };
    assert_eq!(step(&changed), RotationStep::AdoptNextCa { request: "r1".into() });
}

#[test]
fn what_no_rotation_made_is_refused_never_repaired() {
    let corrupt = RotationView {
        next: NextCa::Corrupt("Secret ns/c1-managed-etcd-next has no tls.key".into()),
        ..asked()
    };
    let refused = hold(&corrupt);
    assert_eq!(refused.reason, reason::CA_ROTATION_REFUSED);
    assert!(refused.message.contains("never replaced"), "{}", refused.message);
    // A member two ranks from another cannot reach it.
    let apart = rotating([0, 2, 1]);
    let refused = hold(&apart);
    assert_eq!(refused.reason, reason::CA_ROTATION_REFUSED);
    assert!(
        refused.message.contains("m0") && refused.message.contains("m1"),
        "{}",
        refused.message
    );
    // A member whose ca.crt holds a CA that is neither.
    let mut foreign = rotating([1, 1, 1]);
    foreign.members[2].bundle = Some(Bundle(vec![O.into(), "stranger".into()]));
    let refused = hold(&foreign);
    assert!(refused.message.contains("Machine m2"), "{}", refused.message);
    // A member whose config is gone is left to the rest of the plan.
    let mut gone = rotating([1, 0, 0]);
    gone.members[2].bundle = None;
    assert_eq!(step(&gone), roll(Phase::Trusting, 1, &["m1", "m2"]));
}

#[test]
fn progress_names_the_phase_each_members_signer_and_what_is_left() {
    let mut v = RotationView {
        control_plane: Some(control_plane_rolled()),
        ..rotating([2, 1, 1])
    };
    v.members[2].signed_by = None;
    let p = progress(&v);
    assert_eq!(p.phase, Phase::Signing);
    assert_eq!(p.request.as_deref(), Some("r1"));
    assert_eq!(
        p.members,
        [
            ("m0".to_string(), "next"),
            ("m1".to_string(), "current"),
            ("m2".to_string(), "unknown")
        ]
    );
    assert_eq!(p.remaining, [Phase::Dropping, Phase::Finishing]);
    assert_eq!(progress(&asked()).request.as_deref(), Some("r1"));
    assert_eq!(
        Phase::Generating.remaining().len(),
        5,
        "every phase after generating"
    );
    assert_eq!(Phase::Finishing.remaining(), []);
    assert_eq!(Phase::ControlPlane.to_string(), "ControlPlane");
}

/// Walked through from request to done, each step's effect applied to the view: the phases
/// come in order, each at most once, and no two members are ever two ranks apart.
#[test]
fn a_whole_rotation_walks_every_phase_once_in_order() {
    let mut v = asked();
    let mut seen = vec![phase(&v)];
    for _ in 0..40 {
        let Some(decision) = decide(&v) else { break };
        let Decision::Do(step) = decision else {
            // The only hold on this walk: the control plane's rollout in progress.
            v.control_plane.as_mut().unwrap().rollout_complete = true;
            continue;
        };
        match step {
            RotationStep::CreateNextCa { request } => {
                v.next = NextCa::Present {
                    fingerprint: N.into(),
                    request,
                }
            }
            // The rolling replacement: one Machine at a time.
            RotationStep::Roll { target, outdated, .. } => {
                let machine = outdated.first().unwrap().clone();
                let member = v.members.iter_mut().find(|m| m.machine == machine).unwrap();
                member.signed_by = target.signer().map(str::to_string);
                member.bundle = Some(target);
            }
            RotationStep::HandControlPlane { trusted, .. } => {
                let cp = v.control_plane.as_mut().unwrap();
                cp.trusted = trusted;
                cp.client_signed_by = Some(N.into());
                cp.client_reissued = Some(ts("2026-03-01T12:00:00Z"));
            }
            RotationStep::RollControlPlane { after, .. } => {
                let cp = v.control_plane.as_mut().unwrap();
                cp.rollout_after = Some(after);
                cp.rollout_complete = false;
            }
            RotationStep::AdoptNextCa { request } => {
                v.current = N.into();
                v.rotated_for = Some(request);
            }
            RotationStep::ForgetOldCa { trust_new_only } => {
                if trust_new_only {
                    v.control_plane.as_mut().unwrap().trusted = vec![N.into()];
                }
                v.next = NextCa::Missing;
            }
        }
        if let NextCa::Present { fingerprint, .. } = &v.next
            && *fingerprint != v.current
        {
            let ranks: Vec<u8> = v
                .members
                .iter()
                .map(|m| m.bundle.as_ref().unwrap().rank(&v.current, fingerprint).unwrap())
                .collect();
            let (low, high) = (ranks.iter().min().unwrap(), ranks.iter().max().unwrap());
            assert!(high - low <= 1, "{ranks:?}");
        }
        let now = phase(&v);
        if seen.last() != Some(&now) {
            seen.push(now);
        }
    }
    let every: Vec<Phase> = Phase::ROTATING.into_iter().chain([Phase::Idle]).collect();
    assert_eq!(seen, every);
    assert_eq!(v.current, N);
    assert_eq!(v.control_plane.unwrap().trusted, [N]);
}
