//! How much a store may cost the controller: the bytes of an answer kept, and how long one
//! request may take from connecting to its last byte. A store that trickles bytes or sends an
//! endless body is cut off by these, whatever it does (docs/security.md).

use std::time::Duration;

/// Bytes of an answer read at most, except an object's content: an S3 answer to anything we
/// ask (an error document, an upload ID, a short listing page) is a few KiB.
pub const MAX_ANSWER_BYTES: usize = 64 << 10;

/// Every request ends within this, whatever the store does: connecting, sending, the answer's
/// headers and its body.
pub const REQUEST_DEADLINE: Duration = Duration::from_secs(60);

/// A part upload carries 5 MiB: this allows 40 KiB/s, slower than any store snapshots belong in.
pub const PART_DEADLINE: Duration = Duration::from_secs(120);

/// Reading or copying a whole object may take this long per byte on top of
/// [`REQUEST_DEADLINE`]: at least 1 MiB/s (an 8 GiB database: about 2 h 17 min).
const MIN_OBJECT_RATE: u64 = 1 << 20;

/// Dialling the endpoint gives up after this.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A request whose answer stops arriving for this long fails (before its deadline).
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

/// Listing pages are asked for this many keys, so a page (keys up to 1 KiB) fits
/// [`MAX_ANSWER_BYTES`].
pub const LIST_PAGE_KEYS: usize = 32;

/// The largest object whose size lengthens a deadline: a snapshot of the largest quota etcd is
/// run with (32 GiB) and etcd's checksum. The size is the store's word (Content-Length), so a
/// store that announces more gets no more time: 9 h 7 min at most.
pub const MAX_OBJECT_SIZE: u64 = (32 << 30) + 32;

/// The deadline of a request that reads or copies an object of `size` bytes whole.
pub fn object_deadline(size: u64) -> Duration {
    REQUEST_DEADLINE + Duration::from_secs(size.min(MAX_OBJECT_SIZE) / MIN_OBJECT_RATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_objects_deadline_grows_with_its_size() {
        assert_eq!(object_deadline(0), REQUEST_DEADLINE);
        assert_eq!(
            object_deadline(8 << 30),
            REQUEST_DEADLINE + Duration::from_secs(8192)
        );
        // A store's Content-Length counts up to the largest snapshot.
        assert_eq!(
            object_deadline(u64::MAX),
            REQUEST_DEADLINE + Duration::from_secs(32 << 10)
        );
        assert_eq!(object_deadline(u64::MAX), object_deadline(MAX_OBJECT_SIZE));
        // A listing page of the longest keys fits the answer cap.
        const { assert!(LIST_PAGE_KEYS * 1800 < MAX_ANSWER_BYTES) };
    }
}
