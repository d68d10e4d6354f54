//! The sandbox's accounts, as its own `/etc/passwd` and `/etc/group` say: whom a process runs as
//! or a file belongs to when a caller names an account, and the names of files' owners.
//!
//! Both files are the sandbox's, so anything may be in them: they are opened without blocking or
//! following into a device (see [`super::safe_open`]), read up to a bound, and parsed leniently
//! (a malformed line is skipped, never fatal).

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;

use super::safe_open;
use super::spawn::error;
use sandbox_mcp_protocol::{AgentError, ErrorKind};

/// Most bytes of either file read.
const MAX_FILE: u64 = 1 << 20;

/// An account to run as or to own files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
    pub shell: String,
}

impl Account {
    /// The variables that name the account to a process.
    pub(crate) fn env(&self) -> Vec<(String, String)> {
        [
            ("HOME", &self.home),
            ("USER", &self.name),
            ("LOGNAME", &self.name),
            ("SHELL", &self.shell),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect()
    }
}

fn read(path: &str) -> String {
    let mut text = String::new();
    if let Ok(f) = safe_open::read(Path::new(path)) {
        let mut bytes = Vec::new();
        let _ = f.take(MAX_FILE).read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

/// `name:x:uid:gid:…` lines: each one's fields.
fn records(text: &str) -> impl Iterator<Item = Vec<&str>> {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split(':').collect::<Vec<_>>())
        .filter(|f| f.len() >= 3 && !f[0].is_empty() && f[2].parse::<u32>().is_ok())
}

fn parse_account(fields: &[&str]) -> Option<Account> {
    if fields.len() < 7 {
        return None;
    }
    Some(Account {
        name: fields[0].to_string(),
        uid: fields[2].parse().ok()?,
        gid: fields[3].parse().ok()?,
        home: if fields[5].is_empty() { "/" } else { fields[5] }.to_string(),
        shell: if fields[6].is_empty() {
            "/bin/sh"
        } else {
            fields[6]
        }
        .to_string(),
    })
}

/// The account called `name` in `passwd` (text of the file); root is always there.
pub(crate) fn find(passwd: &str, name: &str) -> Result<Account, AgentError> {
    if name.is_empty() || name.len() > 256 || name.contains([':', '\n', '\0']) {
        return Err(error(
            ErrorKind::InvalidArgument,
            format!(
                "{:?} is not an account name",
                name.chars().take(64).collect::<String>()
            ),
        ));
    }
    if let Some(a) = records(passwd)
        .filter(|f| f[0] == name)
        .find_map(|f| parse_account(&f))
    {
        return Ok(a);
    }
    if name == "root" {
        return Ok(Account {
            name: "root".into(),
            uid: 0,
            gid: 0,
            home: "/root".into(),
            shell: "/bin/sh".into(),
        });
    }
    Err(error(
        ErrorKind::NotFound,
        format!(
            "there is no account {name} in this sandbox's /etc/passwd; run as root, or create it first (useradd {name})"
        ),
    ))
}

/// The account called `name`, from the sandbox's `/etc/passwd`.
pub fn lookup(name: &str) -> Result<Account, AgentError> {
    find(&read("/etc/passwd"), name)
}

/// Names of owners and groups, read once for a listing.
pub(crate) struct Names {
    users: HashMap<u32, String>,
    groups: HashMap<u32, String>,
}

fn by_id(text: &str) -> HashMap<u32, String> {
    let mut map = HashMap::new();
    for f in records(text) {
        if let Ok(id) = f[2].parse() {
            // The first line for an id names it, as getpwuid does.
            map.entry(id).or_insert_with(|| f[0].to_string());
        }
    }
    map
}

impl Names {
    pub(crate) fn load() -> Names {
        Names::parse(&read("/etc/passwd"), &read("/etc/group"))
    }

    fn parse(passwd: &str, group: &str) -> Names {
        Names {
            users: by_id(passwd),
            groups: by_id(group),
        }
    }

    pub(crate) fn user(&self, uid: u32) -> String {
        self.users
            .get(&uid)
            .cloned()
            .unwrap_or_else(|| uid.to_string())
    }

    pub(crate) fn group(&self, gid: u32) -> String {
        self.groups
            .get(&gid)
            .cloned()
            .unwrap_or_else(|| gid.to_string())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/bash\n# a comment\nbroken line\nuser:x:1000:1000:user:/home/user:/bin/bash\nbad:x:notanumber:1:::\nalias:x:1000:1000::/x:\n";

    #[test]
    fn accounts_are_found_by_name_and_malformed_lines_are_skipped() {
        let user = find(PASSWD, "user").unwrap();
        assert_eq!(
            (user.uid, user.gid, user.home.as_str()),
            (1000, 1000, "/home/user")
        );
        assert_eq!(find(PASSWD, "alias").unwrap().shell, "/bin/sh");
        let e = find(PASSWD, "nobody").unwrap_err();
        assert_eq!(e.kind, ErrorKind::NotFound);
        assert!(e.message.contains("useradd nobody"), "{}", e.message);
        assert!(find(PASSWD, "bad").is_err());
        assert_eq!(
            find(PASSWD, "a:b").unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
        // Root exists even where the file does not say so.
        assert_eq!(find("", "root").unwrap().uid, 0);
    }

    #[test]
    fn ids_are_named_by_their_first_line_or_else_by_number() {
        let names = Names::parse(PASSWD, "root:x:0:\nuser:x:1000:\n");
        assert_eq!(names.user(1000), "user");
        assert_eq!(names.user(0), "root");
        assert_eq!(names.user(4242), "4242");
        assert_eq!(names.group(1000), "user");
        assert_eq!(names.group(7), "7");
    }
}
