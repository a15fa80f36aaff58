//! The namespace's firewall and NAT rules (NAT, mangle, filter, raw) as its own tools print them:
//! `iptables-nft-save` and `ip6tables-nft-save`, and the legacy pair only where the namespace
//! has a legacy nat table (asking for one it lacks would create it) — what `kstall explain pod`
//! reads too; then `nft list ruleset`, for the tables made with nft itself (kube-proxy's nftables
//! mode, a CNI or mesh writing nftables directly), which no iptables-save shows. Each runs inside
//! the namespace ([`enter::run_in`]) and is killed at the deadline shared by all of them; each
//! output is kept verbatim (at most 16 MiB, `run_in`'s bound).
//!
//! nft's ruleset is printed whole, iptables-nft's own tables included: they are nf_tables tables
//! too, so `nft list ruleset` lists them again (`table ip nat { chain OUTPUT { ... } }`) beside the
//! native ones. Nothing is filtered out: the section is the namespace's whole nf_tables ruleset as
//! the kernel gives it to nft, the ground truth for nf_tables, and telling iptables-nft's tables
//! apart would take nft's stderr warnings (`# Warning: table ip nat is managed by iptables-nft, do
//! not touch!`, not kept) or guessing by name. Read those tables in the iptables-save sections
//! above it: nft's translation of their xtables matches is lossy (a `-m comment` is left out, a
//! match nft cannot translate shows as `xt match u32`, its arguments left out), while
//! iptables-nft-save prints them as they were written. Legacy tables are not nf_tables: they are
//! only in the `-legacy-save` sections.

use std::{fs::File, path::Path, time::Instant};

use crate::enter::{find_program, legacy_has_nat, run_in};

/// `rules.txt`: each program's output verbatim under a `# program` line (`# nft list ruleset`
/// for nft's), or one line why not, a blank line after each. `legacy` says, for IPv4 and IPv6,
/// whether the namespace has a legacy nat table.
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
            let ran = find_program(&program).map(|path| run_in(netns, &path, &[], until));
            out.push_str(&section(&program, &program, ran));
        }
    }
    let ran = find_program("nft").map(|path| run_in(netns, &path, &["list", "ruleset"], until));
    out.push_str(&section("nft", "nft list ruleset", ran));
    out
}

/// One program's section: its output verbatim under `# {title}` (a newline added only where the
/// output was cut inside a line), or one line why not — `ran` is `None` where the program is not
/// installed. A blank line after it.
fn section(program: &str, title: &str, ran: Option<Result<String, String>>) -> String {
    let mut text = match ran {
        None => format!("# {program}: not installed where kstall runs\n"),
        Some(Ok(output)) => format!("# {title}\n{output}"),
        Some(Err(e)) => format!("# {program}: {e}\n"),
    };
    if !text.ends_with('\n') {
        text.push('\n');
    }
    text.push('\n');
    text
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
        // nft's section last: its ruleset, or why not (not installed, or refused without root).
        let nft = text.rfind("\n# nft").map(|at| &text[at + 1..]).unwrap_or_else(|| panic!("{text}"));
        assert!(nft.starts_with("# nft list ruleset\n") || nft.starts_with("# nft: "), "{text}");
    }

    /// The three ways a section reads, without running anything.
    #[test]
    fn a_section_is_the_output_verbatim_or_one_line_why_not() {
        let ruleset = "table inet t {\n\tchain out {\n\t\ttcp dport 2049 redirect to :15001\n\t}\n}\n";
        assert_eq!(
            section("nft", "nft list ruleset", Some(Ok(ruleset.into()))),
            format!("# nft list ruleset\n{ruleset}\n")
        );
        assert_eq!(section("nft", "nft list ruleset", Some(Ok(String::new()))), "# nft list ruleset\n\n");
        assert_eq!(section("nft", "nft list ruleset", None), "# nft: not installed where kstall runs\n\n");
        let refused = "nft failed (exit status: 1): Error: cannot list ruleset".to_string();
        assert_eq!(
            section("nft", "nft list ruleset", Some(Err(refused))),
            "# nft: nft failed (exit status: 1): Error: cannot list ruleset\n\n"
        );
        // Cut inside a line (run_in's bound): the next section still starts on its own line.
        assert_eq!(
            section("iptables-nft-save", "iptables-nft-save", Some(Ok("*nat\n-A OUT".into()))),
            "# iptables-nft-save\n*nat\n-A OUT\n\n"
        );
    }
}
