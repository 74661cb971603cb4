//! Why: what the Cargo benches (`benches/`) share to set a measurement up: their number
//! arguments, and a member's database filled to a size.

use etcdadm_shared::etcd::MemberClient;

use crate::error::SimError;

const MIB: u64 = 1 << 20;

/// The number after `name` on the bench's command line (`-- --size-mib 200`), `default`
/// without one.
pub fn number_arg(name: &str, default: u64) -> Result<u64, SimError> {
    let args: Vec<String> = std::env::args().collect();
    match args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)) {
        Some(value) => value
            .parse()
            .map_err(|_| SimError::Setup(format!("{name} takes a number, not {value:?}"))),
        None => Ok(default),
    }
}

/// Put 1 MiB values of distinct bytes (`bulk/<n>`, 16 between two looks at the size) through
/// `kv` until `member`'s database holds at least `target` bytes; how many were put.
pub async fn fill_database(
    member: &MemberClient,
    kv: &mut etcd_client::Client,
    target: u64,
) -> Result<u64, SimError> {
    let failed = |e: &dyn std::fmt::Display| SimError::Setup(format!("filling the database: {e}"));
    let mut i = 0u64;
    while member.status().await.map_err(|e| failed(&e))?.db_size < target {
        for _ in 0..16 {
            let value: Vec<u8> = (0..MIB).map(|b| (b ^ i.wrapping_mul(2654435761)) as u8).collect();
            kv.put(format!("bulk/{i:06}"), value, None)
                .await
                .map_err(|e| failed(&e))?;
            i += 1;
        }
    }
    Ok(i)
}
