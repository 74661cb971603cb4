//! How long the sim's infrastructure takes to boot a Machine, so the sim can show what users of
//! slow infrastructure see: a Machine gets its address and runs its user data only this long
//! after its bootstrap data exists (a cloud VM or a bare-metal host takes 30 s to minutes).

use std::time::Duration;

use etcdadm_shared::duration;

/// The boot delay of every Machine, or how each one's is drawn.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum BootDelay {
    /// Booted as soon as its bootstrap data exists (the sim's own pace, well under a second).
    #[default]
    None,
    Fixed(Duration),
    /// Uniform in `[min, max]` to the millisecond, one draw per Machine in the order their
    /// bootstrap data is first seen (Machines seen in the same pass by name), from `seed`: the
    /// same seed gives the same sequence of delays.
    Seeded {
        min: Duration,
        max: Duration,
        seed: u64,
    },
}

impl BootDelay {
    /// `30s` (fixed) or `20s-40s` (a range, drawn from `seed`); `0s` is no delay.
    pub fn parse(text: &str, seed: u64) -> Result<BootDelay, String> {
        let one = |part: &str| duration::parse(part).map_err(|e| format!("boot delay {text:?}: {e}"));
        match text.split_once('-') {
            None => {
                let fixed = one(text)?;
                Ok(if fixed.is_zero() {
                    BootDelay::None
                } else {
                    BootDelay::Fixed(fixed)
                })
            }
            Some((min, max)) => {
                let (min, max) = (one(min)?, one(max)?);
                if min > max {
                    return Err(format!("boot delay {text:?}: the range's start is after its end"));
                }
                Ok(BootDelay::Seeded { min, max, seed })
            }
        }
    }

    /// What the bench prints: `none`, `30s`, `20s-40s (seed 7)`.
    pub fn describe(&self) -> String {
        match self {
            BootDelay::None => "none".into(),
            BootDelay::Fixed(d) => duration::format(*d),
            BootDelay::Seeded { min, max, seed } => format!(
                "{}-{} (seed {seed})",
                duration::format(*min),
                duration::format(*max)
            ),
        }
    }

    /// The delays of Machines in the order they ask to boot.
    pub fn draws(&self) -> Draws {
        let state = match self {
            BootDelay::Seeded { seed, .. } => *seed,
            _ => 0,
        };
        Draws { delay: *self, state }
    }
}

/// One delay per Machine, in order.
#[derive(Clone, Debug)]
pub struct Draws {
    delay: BootDelay,
    state: u64,
}

impl Draws {
    /// The next Machine's boot delay.
    pub fn next_delay(&mut self) -> Duration {
        match self.delay {
            BootDelay::None => Duration::ZERO,
            BootDelay::Fixed(d) => d,
            BootDelay::Seeded { min, max, .. } => {
                let span = u64::try_from((max - min).as_millis()).unwrap_or(u64::MAX);
                let offset = self.next_u64() % span.saturating_add(1);
                min + Duration::from_millis(offset)
            }
        }
    }

    /// splitmix64: small, and the same everywhere for a seed.
    fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_delay_is_fixed_or_drawn_from_its_seed_within_its_range() {
        assert_eq!(BootDelay::parse("0s", 1).unwrap(), BootDelay::None);
        let fixed = BootDelay::parse("30s", 1).unwrap();
        assert_eq!(fixed, BootDelay::Fixed(Duration::from_secs(30)));
        assert_eq!(fixed.draws().next_delay(), Duration::from_secs(30));
        let range = BootDelay::parse("10s-20s", 7).unwrap();
        let first: Vec<Duration> = {
            let mut draws = range.draws();
            (0..50).map(|_| draws.next_delay()).collect()
        };
        let again: Vec<Duration> = {
            let mut draws = range.draws();
            (0..50).map(|_| draws.next_delay()).collect()
        };
        assert_eq!(first, again, "the same seed, the same delays");
        assert!(
            first
                .iter()
                .all(|d| (Duration::from_secs(10)..=Duration::from_secs(20)).contains(d)),
            "{first:?}"
        );
        assert!(first.windows(2).any(|w| w[0] != w[1]), "{first:?}");
        let other: Vec<Duration> = {
            let mut draws = BootDelay::parse("10s-20s", 8).unwrap().draws();
            (0..50).map(|_| draws.next_delay()).collect()
        };
        assert_ne!(first, other);
        assert_eq!(range.describe(), "10s-20s (seed 7)");
        assert!(BootDelay::parse("20s-10s", 1).is_err());
        assert!(BootDelay::parse("soon", 1).is_err());
    }
}
