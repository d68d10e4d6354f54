//! The one parser of `/proc/self/mountinfo` (cgroup layouts, the sandbox store's mount, the
//! cgroup2 remount all read it): the fields that matter, and mountinfo's octal escapes undone.

/// What is read of one /proc/self/mountinfo line.
pub struct MountLine<'a> {
    /// The directory of its filesystem the mount shows (`/` unless it is a bind of a part).
    pub root: &'a str,
    pub point: &'a str,
    /// The mount's own options (`rw,nosuid,…`).
    pub options: &'a str,
    pub fstype: &'a str,
    /// The filesystem's options (for cgroups, the controllers or hierarchy options).
    pub super_options: &'a str,
}

/// The lines of `info` (mountinfo) that parse; the optional fields before ` - ` are skipped.
pub fn mounts(info: &str) -> impl Iterator<Item = MountLine<'_>> {
    info.lines().filter_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut left = left.split_whitespace();
        let root = left.nth(3)?;
        let point = left.next()?;
        let options = left.next().unwrap_or("");
        let mut right = right.split_whitespace();
        let fstype = right.next()?;
        let super_options = right.nth(1).unwrap_or("");
        Some(MountLine {
            root,
            point,
            options,
            fstype,
            super_options,
        })
    })
}

/// Undoes mountinfo's octal escapes (`\040` for a space, and so on).
pub fn unescape(field: &str) -> Vec<u8> {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && let Some(v) = std::str::from_utf8(&b[i + 1..i + 4])
                .ok()
                .and_then(|s| u8::from_str_radix(s, 8).ok())
        {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_undone() {
        assert_eq!(unescape(r"/tmp/a\040b"), b"/tmp/a b");
        assert_eq!(unescape(r"/x\134y"), b"/x\\y");
        assert_eq!(unescape(r"/plain"), b"/plain");
        assert_eq!(unescape(r"/trailing\04"), b"/trailing\\04");
    }
}
