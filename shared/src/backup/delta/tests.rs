use super::chain::{Chain, ChainError, DeltaName, Target, plan};
use super::*;

fn put(revision: i64, key: &str, value: &str) -> Event {
    Event {
        kind: Kind::Put,
        revision,
        received_ms: 1_700_000_000_000 + revision,
        lease: 0,
        key: key.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
    }
}

fn delete(revision: i64, key: &str) -> Event {
    Event {
        kind: Kind::Delete,
        value: vec![],
        ..put(revision, key, "")
    }
}

fn sample() -> Vec<Event> {
    vec![
        put(11, "a", "1"),
        Event {
            lease: 0x694d_7f00_1234,
            ..put(12, "b", "binary\0\u{7f}")
        },
        // One transaction: two events at one revision.
        put(13, "c", ""),
        delete(13, "a"),
        put(14, "a", "again"),
    ]
}

#[test]
fn a_delta_reads_back_as_written() {
    let bytes = encode(10, &sample()).unwrap();
    assert_eq!(&bytes[..MAGIC.len()], MAGIC);
    let delta = decode(&bytes).unwrap();
    assert_eq!((delta.base, delta.first, delta.last), (10, 11, 14));
    assert_eq!(delta.events, sample());
}

#[test]
fn events_out_of_order_or_not_after_the_snapshot_are_not_encoded() {
    let cases: Vec<(i64, Vec<Event>, &str)> = vec![
        (10, vec![], "at least one event"),
        (11, sample(), "do not follow the full snapshot's 11"),
        (
            10,
            vec![put(11, "a", "1"), put(13, "b", "2")],
            "revision 13 follows 11",
        ),
        (
            10,
            vec![put(12, "a", "1"), put(11, "b", "2")],
            "revisions 12 to 11",
        ),
    ];
    for (base, events, said) in cases {
        let error = encode(base, &events).unwrap_err().to_string();
        assert!(error.contains(said), "{said}: {error}");
    }
}

#[test]
fn every_damage_is_refused_by_name_and_nothing_panics() {
    let bytes = encode(10, &sample()).unwrap();
    assert_eq!(decode(b"etcd"), Err(DeltaError::NotADelta));
    assert_eq!(decode(b"some other object entirely"), Err(DeltaError::NotADelta));
    assert_eq!(decode(MAGIC), Err(DeltaError::Truncated("no checksum")));
    // Every truncation and every flipped bit of the content is caught by the checksum.
    for cut in MAGIC.len()..bytes.len() {
        assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
    }
    for at in MAGIC.len()..bytes.len() {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x10;
        assert!(decode(&flipped).is_err(), "bit flipped at {at}");
    }
}

/// A checksum recomputed over a lying header (a writer with the format's rules wrong, or a
/// forger): the content is still refused, and no count makes it reserve memory.
#[test]
fn a_consistent_checksum_over_an_inconsistent_content_is_refused() {
    let reseal = |mut body: Vec<u8>| {
        body.truncate(body.len() - 32);
        let sum = Sha256::digest(&body);
        body.extend_from_slice(&sum);
        body
    };
    let bytes = encode(10, &sample()).unwrap();
    let count_at = MAGIC.len() + 24;
    let mut huge_count = bytes.clone();
    huge_count[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert_eq!(
        decode(&reseal(huge_count)),
        Err(DeltaError::Truncated("fewer events than its header counts"))
    );
    let mut wrong_last = bytes.clone();
    wrong_last[MAGIC.len() + 16..MAGIC.len() + 24].copy_from_slice(&20i64.to_be_bytes());
    assert!(matches!(decode(&reseal(wrong_last)), Err(DeltaError::Inconsistent(m)) if m.contains("20")));
    let mut huge_key = bytes;
    // The first event's key length.
    let key_len_at = MAGIC.len() + 28 + 1 + 24;
    huge_key[key_len_at..key_len_at + 4].copy_from_slice(&u32::MAX.to_be_bytes());
    assert!(decode(&reseal(huge_key)).is_err());
}

fn name(seq: u32, first: i64, last: i64) -> DeltaName {
    DeltaName {
        seq,
        first,
        last,
        first_ms: first * 1000,
        last_ms: last * 1000,
    }
}

#[test]
fn a_delta_name_is_a_sorted_key_beside_its_snapshot_and_reads_back() {
    let key = "ns/c1-etcd/nightly-20261128.db";
    let n = DeltaName {
        seq: 3,
        first: 101,
        last: 250,
        first_ms: 1_764_000_000_000,
        last_ms: 1_764_000_020_000,
    };
    let written = n.key(key);
    assert_eq!(
        written,
        "ns/c1-etcd/nightly-20261128.db.deltas/00000003-0000000000000000101-0000000000000000250-1764000000000-1764000020000"
    );
    assert_eq!(DeltaName::parse(key, &written), Some(n));
    assert!(name(2, 1, 1).key(key) < name(10, 1, 1).key(key));
    for other in [
        "ns/c1-etcd/nightly-20261128.db",
        "ns/c1-etcd/other.db.deltas/00000003-1-2-3-4",
        &format!("{key}.deltas/00000003-1-2-3"),
        &format!("{key}.deltas/00000003-1-2-3-4-5"),
        &format!("{key}.deltas/00000003-5-2-3-4"),
        &format!("{key}.deltas/x-1-2-3-4"),
    ] {
        assert_eq!(DeltaName::parse(key, other), None, "{other}");
    }
}

/// A case, the deltas listed, the revision recorded as uploaded, the point, and the deltas taken.
type ChainCase = (
    &'static str,
    Vec<DeltaName>,
    Option<i64>,
    Target,
    Result<Vec<u32>, ChainError>,
);

#[test]
fn the_chain_to_each_point_takes_what_it_needs_and_refuses_what_is_missing() {
    let whole = [name(1, 11, 20), name(3, 31, 40), name(2, 21, 30)];
    let seqs = |chain: Chain| chain.deltas.iter().map(|d| d.seq).collect::<Vec<_>>();
    let cases: Vec<ChainCase> = vec![
        (
            "latest: all, in order",
            whole.to_vec(),
            Some(40),
            Target::Latest,
            Ok(vec![1, 2, 3]),
        ),
        (
            "latest, more uploaded than recorded",
            whole.to_vec(),
            Some(30),
            Target::Latest,
            Ok(vec![1, 2, 3]),
        ),
        (
            "latest, nothing since the snapshot",
            vec![],
            None,
            Target::Latest,
            Ok(vec![]),
        ),
        (
            "revision in the middle",
            whole.to_vec(),
            Some(40),
            Target::Revision(25),
            Ok(vec![1, 2]),
        ),
        (
            "revision on a delta's end",
            whole.to_vec(),
            Some(40),
            Target::Revision(20),
            Ok(vec![1]),
        ),
        (
            "the snapshot's own revision",
            whole.to_vec(),
            Some(40),
            Target::Revision(10),
            Ok(vec![]),
        ),
        (
            "a time inside the second",
            whole.to_vec(),
            Some(40),
            Target::Time(25_500),
            Ok(vec![1, 2]),
        ),
        (
            "a time before any delta",
            whole.to_vec(),
            Some(40),
            Target::Time(5_000),
            Ok(vec![]),
        ),
        (
            "a time after them all",
            whole.to_vec(),
            Some(40),
            Target::Time(99_000),
            Ok(vec![1, 2, 3]),
        ),
        (
            "a gap",
            vec![name(1, 11, 20), name(3, 31, 40)],
            Some(40),
            Target::Latest,
            Err(ChainError::Gap {
                seq: 3,
                first: 31,
                expected: 21,
            }),
        ),
        (
            "a gap past the revision asked for does not matter",
            vec![name(1, 11, 20), name(3, 31, 40)],
            Some(40),
            Target::Revision(15),
            Ok(vec![1]),
        ),
        (
            "the first delta does not follow the snapshot",
            vec![name(1, 12, 20)],
            None,
            Target::Latest,
            Err(ChainError::Gap {
                seq: 1,
                first: 12,
                expected: 11,
            }),
        ),
        (
            "the last delta lost",
            vec![name(1, 11, 20), name(2, 21, 30)],
            Some(40),
            Target::Latest,
            Err(ChainError::MissingTail {
                recorded: 40,
                reached: 30,
            }),
        ),
        (
            "the last delta lost, a time after the rest",
            vec![name(1, 11, 20), name(2, 21, 30)],
            Some(40),
            Target::Time(99_000),
            Err(ChainError::MissingTail {
                recorded: 40,
                reached: 30,
            }),
        ),
        (
            "the last delta lost, a time inside the rest",
            vec![name(1, 11, 20), name(2, 21, 30)],
            Some(40),
            Target::Time(25_000),
            Ok(vec![1, 2]),
        ),
        (
            "a revision past the deltas",
            whole.to_vec(),
            Some(40),
            Target::Revision(41),
            Err(ChainError::Short {
                wanted: 41,
                reached: 40,
            }),
        ),
        (
            "a revision before the snapshot",
            whole.to_vec(),
            Some(40),
            Target::Revision(9),
            Err(ChainError::BeforeSnapshot { wanted: 9, base: 10 }),
        ),
        (
            "two objects with one number",
            vec![name(1, 11, 20), name(1, 11, 25)],
            None,
            Target::Latest,
            Err(ChainError::Repeated(1)),
        ),
    ];
    for (case, listed, recorded, target, expected) in cases {
        assert_eq!(plan(10, &listed, recorded, target).map(seqs), expected, "{case}");
    }
}

#[test]
fn a_chain_counts_the_events_of_its_point() {
    let chain = |target| Chain {
        deltas: vec![],
        target,
    };
    assert!(chain(Target::Latest).includes(99, 99));
    assert!(chain(Target::Revision(25)).includes(25, 0));
    assert!(!chain(Target::Revision(25)).includes(26, 0));
    assert!(chain(Target::Time(25_000)).includes(99, 25_000));
    assert!(!chain(Target::Time(25_000)).includes(1, 25_001));
}
