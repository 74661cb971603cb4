//! `etcdadm-sim bench boot`: create-to-Ready and a scale-up on infrastructure whose Machines take
//! a while to boot (`--boot-delay`), with one Machine at a time (`provisioning.parallelMachines:
//! 1`, how every member was created before Machines booted ahead) and with Machines booting
//! ahead of their turn (the default): what users of slow infrastructure see.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use kube::api::{Api, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use etcdadm_shared::api::EtcdadmCluster;
use etcdadm_shared::api::capi::Machine;
use etcdadm_shared::etcd::EtcdTls;
use etcdadm_shared::names;
use k8s_openapi::api::core::v1::Secret;

use crate::bench::load_average;
use crate::bench_steps::{MemberSteps, observe};
use crate::bench_timeline::{self, Timeline};
use crate::boot_delay::BootDelay;
use crate::demo::etcd_tls;
use crate::error::SimError;
use crate::manifests::{ManagedCluster, create_managed_cluster};
use crate::plane::{DEFAULT_KCP_ROLLOUT_STEP, NAMESPACE, Plane, PlaneOptions};

const POLL: Duration = Duration::from_millis(50);
/// The loopback prefix (`127.0.110.N`) of these runs: no scenario uses it.
const BENCH_PREFIX: u8 = 110;
const TIMEOUT: Duration = Duration::from_secs(900);

/// How the Machines of a run are brought up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Provisioning {
    /// `parallelMachines: 1`: each Machine created once the previous member joined.
    OneAtATime,
    /// The default: every Machine the creation or scale-up needs at once, joining one at a time.
    BootAhead,
}

impl Provisioning {
    fn spec(self) -> Value {
        match self {
            Provisioning::OneAtATime => json!({"provisioning": {"parallelMachines": 1}}),
            Provisioning::BootAhead => Value::Null,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Provisioning::OneAtATime => "one at a time",
            Provisioning::BootAhead => "boot ahead",
        }
    }
}

/// What one run measured: the time to Ready from the change, and the joins in it.
#[derive(Clone, Debug)]
pub struct BootRun {
    pub total: Duration,
    /// When each step was seen (a creation's critical path is printed from it).
    pub timeline: Timeline,
    /// Σ over the members added of the time each took once it could start: the first member's
    /// address → healthy (`etcdadm init`), a joiner's learner added → healthy voter. What is
    /// left of `total` is boot delays and the controllers' own steps.
    pub joins: Duration,
    pub members: usize,
}

/// Σ of the joins in `steps` (in creation order; `init` when the first is the first member).
fn sum_of_joins(steps: &[MemberSteps], init: bool) -> Duration {
    steps
        .iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let from = if init && i == 0 { s.address } else { s.listed };
            Some(s.healthy?.saturating_sub(from?))
        })
        .sum()
}

/// Watch the cluster `bench` until it is Ready with `members`, recording each new Machine's
/// steps (Machines in `known` left out) and the init Secret's publication, from `start`.
async fn until_ready(
    client: &Client,
    work_dir: &Path,
    members: i32,
    known: &[String],
    start: Instant,
) -> Result<Timeline, SimError> {
    let mut steps: BTreeMap<String, MemberSteps> = BTreeMap::new();
    let mut tls: Option<EtcdTls> = None;
    let mut init_published = None;
    let secrets = Api::<Secret>::namespaced(client.clone(), NAMESPACE);
    loop {
        let now = start.elapsed();
        if now > TIMEOUT {
            return Err(SimError::Timeout(format!(
                "bench cluster not Ready with {members} members after {TIMEOUT:?}"
            )));
        }
        if tls.is_none() {
            tls = etcd_tls(client, NAMESPACE, "bench").await?;
        }
        // Ready first: the steps' observation takes a while (a TLS connection per member), and
        // the time to Ready must not include it.
        let etcd = Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
            .get("bench-etcd")
            .await?;
        let ready = etcd.status.as_ref().is_some_and(|s| {
            s.ready && s.ready_replicas == Some(members) && etcd.spec.replicas == Some(members)
        });
        let seen = start.elapsed();
        if init_published.is_none()
            && secrets
                .get_opt(&names::init_secret_name("bench"))
                .await?
                .is_some()
        {
            init_published = Some(now);
        }
        observe(client, work_dir, tls.as_ref(), &mut steps, now).await?;
        if ready {
            let mut new: Vec<MemberSteps> = steps
                .into_iter()
                .filter(|(name, _)| !known.contains(name))
                .map(|(_, s)| s)
                .collect();
            new.sort_by_key(|s| s.created);
            return Ok(Timeline {
                init_published,
                ready: seen,
                members: new,
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// With `SIM_LOG_DIR` set, keep the run's logs there, under the run's directory name.
fn save_logs(work_dir: &Path) {
    let run = work_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    crate::saved_logs::save(work_dir, &run);
}

/// A plane whose Machines boot in `delay`.
async fn plane(work_dir: &Path, delay: BootDelay) -> Result<Plane, SimError> {
    let _ = std::fs::remove_dir_all(work_dir);
    Plane::start(PlaneOptions {
        work_dir: work_dir.to_path_buf(),
        ip_prefix: [127, 0, BENCH_PREFIX],
        kcp_rollout_step: DEFAULT_KCP_ROLLOUT_STEP,
        boot_delay: delay,
        ..Default::default()
    })
    .await
}

/// Create the cluster `bench` of `members` on `plane`.
async fn create_cluster(plane: &Plane, members: i32, provisioning: Provisioning) -> Result<(), SimError> {
    create_managed_cluster(
        &plane.client,
        NAMESPACE,
        &ManagedCluster {
            name: "bench",
            replicas: members,
            zones: &["zone-a", "zone-b", "zone-c"],
            config_spec: json!({}),
            health_check: Value::Null,
            with_kcp: true,
            extra_spec: provisioning.spec(),
        },
    )
    .await
}

/// Create a cluster of `members` on Machines that boot in `delay`; time create-to-Ready.
pub async fn create(
    work_dir: &Path,
    delay: BootDelay,
    members: i32,
    provisioning: Provisioning,
) -> Result<BootRun, SimError> {
    let plane = plane(work_dir, delay).await?;
    // Timed from the creation, the plane already up (as on a management cluster).
    let start = Instant::now();
    create_cluster(&plane, members, provisioning).await?;
    let timeline = until_ready(&plane.client, work_dir, members, &[], start).await?;
    drop(plane);
    save_logs(work_dir);
    Ok(BootRun {
        total: timeline.ready,
        joins: sum_of_joins(&timeline.members, true),
        members: timeline.members.len(),
        timeline,
    })
}

/// Create a cluster of `from`, then time its scale-up to `to` (from the patch to Ready).
pub async fn scale_up(
    work_dir: &Path,
    delay: BootDelay,
    (from, to): (i32, i32),
    provisioning: Provisioning,
) -> Result<BootRun, SimError> {
    let plane = plane(work_dir, delay).await?;
    create_cluster(&plane, from, provisioning).await?;
    let client = plane.client.clone();
    until_ready(&client, work_dir, from, &[], Instant::now()).await?;
    let known: Vec<String> = Api::<Machine>::namespaced(client.clone(), NAMESPACE)
        .list(&Default::default())
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .collect();
    let start = Instant::now();
    Api::<EtcdadmCluster>::namespaced(client.clone(), NAMESPACE)
        .patch(
            "bench-etcd",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": to}})),
        )
        .await?;
    let timeline = until_ready(&client, work_dir, to, &known, start).await?;
    drop(plane);
    save_logs(work_dir);
    Ok(BootRun {
        total: timeline.ready,
        joins: sum_of_joins(&timeline.members, false),
        members: timeline.members.len(),
        timeline,
    })
}

/// The longest a boot delay can be.
fn longest(delay: BootDelay) -> Duration {
    match delay {
        BootDelay::None => Duration::ZERO,
        BootDelay::Fixed(d) => d,
        BootDelay::Seeded { max, .. } => max,
    }
}

/// What `etcdadm-sim bench boot` runs.
#[derive(Clone, Debug)]
pub struct BootOptions {
    pub delay: BootDelay,
    pub sizes: Vec<i32>,
    pub scale: Option<(i32, i32)>,
    pub runs: usize,
    /// Only this way of provisioning (`--only`); both when `None`.
    pub only: Option<Provisioning>,
}

impl BootOptions {
    /// The command line that reproduces these runs.
    fn command(&self) -> String {
        let scale_flag = self
            .scale
            .map(|(a, b)| format!(" --scale-up {a}:{b}"))
            .unwrap_or_default();
        let delay_flags = match self.delay {
            BootDelay::Seeded { min, max, seed } => format!(
                "--boot-delay {}-{} --boot-seed {seed}",
                etcdadm_shared::duration::format(min),
                etcdadm_shared::duration::format(max)
            ),
            other => format!("--boot-delay {}", other.describe()),
        };
        let only = self
            .only
            .map(|p| format!(" --only {}", p.label().replace(' ', "-")))
            .unwrap_or_default();
        format!(
            "etcdadm-sim bench boot {delay_flags} --sizes {}{scale_flag} --runs {}{only}",
            self.sizes
                .iter()
                .map(i32::to_string)
                .collect::<Vec<_>>()
                .join(","),
            self.runs
        )
    }
}

impl std::str::FromStr for Provisioning {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        match text {
            "boot-ahead" => Ok(Provisioning::BootAhead),
            "one-at-a-time" => Ok(Provisioning::OneAtATime),
            other => Err(format!("--only {other:?}: boot-ahead or one-at-a-time")),
        }
    }
}

/// Run every case `runs` times and print the table: create-to-Ready of each size and the
/// scale-up, one Machine at a time and booting ahead, with the goal for the latter
/// (create: two boot delays + Σ joins + 10 %; scale-up: one boot delay + Σ joins + 10 %), the
/// load average before and after each run, and each creation's critical path.
pub async fn run_boot(work_dir: &Path, options: &BootOptions) -> Result<(), SimError> {
    let delay = options.delay;
    println!(
        "Machines booting in {}: time to Ready, one Machine at a time (parallelMachines 1) and booting ahead (default); \
         command: {}",
        delay.describe(),
        options.command(),
    );
    println!(
        "{:<12} {:<15} {:>10} {:>10} {:>14} {:>12} {:>14}",
        "change", "Machines", "to Ready", "Σ joins", "boot delays", "goal (≤)", "load (1 min)"
    );
    let boot = longest(delay);
    let mut cases: Vec<(String, Option<i32>)> = options
        .sizes
        .iter()
        .map(|n| (format!("create {n}"), Some(*n)))
        .collect();
    if let Some((from, to)) = options.scale {
        cases.push((format!("scale {from}→{to}"), None));
    }
    let provisionings: Vec<Provisioning> = [Provisioning::OneAtATime, Provisioning::BootAhead]
        .into_iter()
        .filter(|p| options.only.is_none_or(|only| only == *p))
        .collect();
    for (label, size) in cases {
        for provisioning in &provisionings {
            let provisioning = *provisioning;
            for run in 0..options.runs {
                let dir = work_dir.join(format!(
                    "boot-{}-{}-{run}",
                    label.replace([' ', '→'], "-"),
                    provisioning.label().replace(' ', "-")
                ));
                let load_before = load_average();
                let result = match (size, options.scale) {
                    (Some(n), _) => create(&dir, delay, n, provisioning).await?,
                    (None, Some(change)) => scale_up(&dir, delay, change, provisioning).await?,
                    (None, None) => continue,
                };
                let _ = std::fs::remove_dir_all(&dir);
                let members = u32::try_from(result.members).unwrap_or(0);
                // Boot delays on the way: one per Machine when one at a time; booting ahead, the
                // first member's then the joiners' together (a joiner's user data names a
                // member to join), or the new Machines' together for a scale-up.
                let (boots, goal) = match (provisioning, size) {
                    (Provisioning::OneAtATime, _) => (members, None),
                    (Provisioning::BootAhead, Some(_)) => (2.min(members), Some(2)),
                    (Provisioning::BootAhead, None) => (1, Some(1)),
                };
                let goal = goal.map(|g| (boot * g + result.joins).mul_f64(1.1));
                println!(
                    "{:<12} {:<15} {:>8.1} s {:>8.1} s {:>14} {:>12} {:>14}",
                    label,
                    provisioning.label(),
                    result.total.as_secs_f64(),
                    result.joins.as_secs_f64(),
                    format!("{boots} × {:.0} s", boot.as_secs_f64()),
                    goal.map_or("-".to_string(), |g| format!("{:.1} s", g.as_secs_f64())),
                    format!("{load_before} → {}", load_average()),
                );
                if size.is_some() && provisioning == Provisioning::BootAhead {
                    bench_timeline::print(&result.timeline);
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steps(address: u64, listed: u64, healthy: u64) -> MemberSteps {
        let s = |secs: u64| Some(Duration::from_secs(secs));
        MemberSteps {
            address: s(address),
            listed: s(listed),
            healthy: s(healthy),
            ..Default::default()
        }
    }

    #[test]
    fn the_sum_of_joins_counts_from_init_or_from_the_learners_addition() {
        let run = [steps(30, 31, 33), steps(65, 66, 68), steps(65, 69, 70)];
        assert_eq!(sum_of_joins(&run, true), Duration::from_secs(3 + 2 + 1));
        assert_eq!(sum_of_joins(&run, false), Duration::from_secs(2 + 2 + 1));
    }
}
