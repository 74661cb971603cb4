//! etcd version strings: which are versions, their minor version, and which moves between two
//! of them etcd allows (one minor at a time, never back).

/// `MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]` (semver, no leading `v`).
pub fn is_etcd_version(v: &str) -> bool {
    let (core, build) = v.split_once('+').map_or((v, None), |(c, b)| (c, Some(b)));
    let (core, pre) = core.split_once('-').map_or((core, None), |(c, p)| (c, Some(p)));
    let numbers: Vec<&str> = core.split('.').collect();
    let ident_ok = |s: &str| {
        !s.is_empty()
            && s.split('.')
                .all(|part| !part.is_empty() && part.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
    };
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit()))
        && pre.is_none_or(ident_ok)
        && build.is_none_or(ident_ok)
}

/// `(major, minor)` of an etcd version (`3.5.9`, `3.6.0-rc.1`, or etcd's own `3.5.9` from its
/// Status response); `None` if it does not start with two numbers.
pub fn major_minor(version: &str) -> Option<(u64, u64)> {
    let mut parts = version.split(['.', '-', '+']);
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// Why members of etcd `to` cannot replace members of `from`, if they cannot: etcd upgrades one
/// minor version at a time (a member of the next minor joins an older cluster, never one two
/// minors newer) and never downgrades a minor (the data format moved on). Patch versions may
/// move either way. Versions that do not parse are answered by [`is_etcd_version`].
pub fn version_change_problem(from: &str, to: &str) -> Option<String> {
    let ((from_major, from_minor), (to_major, to_minor)) = (major_minor(from)?, major_minor(to)?);
    if from_major != to_major {
        return Some(format!(
            "{from} → {to} changes the major version; etcd is upgraded one minor version at a time"
        ));
    }
    if to_minor < from_minor {
        return Some(format!(
            "{from} → {to} downgrades the minor version, which is not possible: new members could not \
             join the running ones, which already use the newer data format"
        ));
    }
    if to_minor > from_minor + 1 {
        return Some(format!(
            "{from} → {to} skips a minor version: etcd is upgraded one minor version at a time \
             ({from_major}.{from_minor} → {from_major}.{} first)",
            from_minor + 1
        ));
    }
    None
}
