//! The namespace's iptables rules (NAT, mangle, filter, raw) as its own tools print them:
//! `iptables-nft-save` and `ip6tables-nft-save`, and the legacy pair only where the namespace
//! has a legacy nat table (asking for one it lacks would create it) — what `kstall explain pod`
//! reads too. Each runs inside the namespace ([`enter::run_in`]) and is killed at the deadline
//! shared by all of them.

use std::{fs::File, path::Path, time::Instant};

use crate::enter::{find_program, legacy_has_nat, run_in};

/// `rules.txt`: each program's output verbatim under a `# program` line, or one line why not.
/// `legacy` says, for IPv4 and IPv6, whether the namespace has a legacy nat table.
pub fn save(netns: &File, legacy: [bool; 2], until: Instant) -> String {
    let mut out = String::new();
    for (v6, has_legacy_nat) in [(false, legacy[0]), (true, legacy[1])] {
        let family = if v6 { "ip6tables" } else { "iptables" };
        for backend in ["nft", "legacy"] {
            let program = format!("{family}-{backend}-save");
            if backend == "legacy" && !has_legacy_nat {
                out.push_str(&format!("# {program}: not run, the namespace has no legacy nat table\n\n"));
                continue;
            }
            let text = match find_program(&program) {
                None => format!("# {program}: not installed where kstall runs\n"),
                Some(path) => match run_in(netns, &path, &[], until) {
                    Ok(text) => format!("# {program}\n{text}"),
                    Err(e) => format!("# {program}: {e}\n"),
                },
            };
            out.push_str(&text);
            out.push('\n');
        }
    }
    out
}

/// Whether the calling thread's namespace has a legacy nat table, IPv4 then IPv6 (called inside
/// it: `/proc/<tid>/net` is the thread's).
pub fn legacy_nat_here() -> [bool; 2] {
    // SAFETY: gettid has no arguments and cannot fail.
    let tid = unsafe { libc::gettid() } as u32;
    let proc = Path::new("/proc");
    [legacy_has_nat(proc, tid, false), legacy_has_nat(proc, tid, true)]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_legacy_nat_table_the_legacy_tools_are_not_run() {
        // The caller's own namespace, whatever it holds: the legacy lines say why they were not run.
        let netns = File::open("/proc/self/ns/net").unwrap();
        let text = save(&netns, [false, false], Instant::now() + crate::enter::READ_DEADLINE);
        assert!(
            text.contains("# iptables-legacy-save: not run, the namespace has no legacy nat table\n"),
            "{text}"
        );
        assert!(text.contains("# ip6tables-legacy-save: not run"), "{text}");
        assert!(text.contains("# iptables-nft-save"), "{text}");
    }
}
