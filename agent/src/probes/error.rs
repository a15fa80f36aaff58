//! Why a probe is down, typed: what the kernel lacks, what it refused, or a privilege missing.
//! `kstall status` shows the text; the kind is decided from the errors themselves (an `EPERM`
//! anywhere in a failed bpf() call's chain), never from their wording.

use crate::kernel_btf::BtfError;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProbeError {
    /// The kernel lacks what the probe needs: a tracepoint, a function, a BTF type or field.
    #[error("{0}")]
    Missing(String),
    /// The kernel refused a program (the verifier's first line and its verdict) or its attach.
    #[error("{what}: {summary}")]
    Refused { what: String, summary: String },
    /// bpf() refused for want of privilege.
    #[error("{what}: {summary} ({})", permission_hint(missing))]
    Permission {
        what: String,
        summary: String,
        /// The capabilities bpf() needs that the agent lacks; none: something else refused
        /// (a seccomp profile, an LSM).
        missing: Vec<&'static str>,
    },
}

impl ProbeError {
    /// A failed bpf() call (`what` says which): a permission error when the kernel answered
    /// `EPERM` and `permission_counts` (an fentry's `EPERM` can be the kernel refusing the
    /// trampoline, not the caller), else a refusal; its text is the error's first line and the
    /// verifier's verdict.
    pub fn bpf(
        what: impl Into<String>,
        error: &(dyn std::error::Error + 'static),
        permission_counts: bool,
    ) -> Self {
        let (what, summary) = (what.into(), summarize(&error_chain(error)));
        if permission_counts && is_eperm(error) {
            let missing = crate::kernel::missing_bpf_capabilities();
            ProbeError::Permission { what, summary, missing }
        } else {
            ProbeError::Refused { what, summary }
        }
    }
}

impl From<BtfError> for ProbeError {
    fn from(e: BtfError) -> Self {
        ProbeError::Missing(e.to_string())
    }
}

impl From<String> for ProbeError {
    fn from(why: String) -> Self {
        ProbeError::Missing(why)
    }
}

impl From<&str> for ProbeError {
    fn from(why: &str) -> Self {
        ProbeError::Missing(why.to_string())
    }
}

fn permission_hint(missing: &[&'static str]) -> String {
    if missing.is_empty() {
        "CAP_BPF and CAP_PERFMON are present: a seccomp profile or LSM refused bpf(); older runtime \
         default profiles allow it only with CAP_SYS_ADMIN, see deploy/README.md"
            .into()
    } else {
        format!("missing {}", missing.join(" and "))
    }
}

/// Whether the kernel answered `EPERM` somewhere in `error`'s chain.
fn is_eperm(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<std::io::Error>().and_then(std::io::Error::raw_os_error) == Some(libc::EPERM) {
            return true;
        }
        next = e.source();
    }
    false
}

pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(inner) = source {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        source = inner.source();
    }
    s
}

/// A verifier log is hundreds of lines; status shows the first line and the verifier's verdict.
pub fn summarize(full: &str) -> String {
    let mut lines = full.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or_default().to_string();
    match lines.next_back() {
        Some(last) => format!("{first} … {}", last.trim()),
        None => first,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// As aya reports a failed syscall: its own error with the kernel's answer as the source.
    #[derive(Debug, thiserror::Error)]
    #[error("the BPF_PROG_LOAD syscall failed. Verifier output: 0: (b7) r0 = 0\ninvalid mem access 'scalar'")]
    struct LoadError(#[source] std::io::Error);

    #[test]
    fn eperm_is_a_permission_error_other_answers_a_refusal() {
        let eperm = LoadError(std::io::Error::from_raw_os_error(libc::EPERM));
        let e = ProbeError::bpf("sched_process_hang (sched_process_hang): load", &eperm, true);
        let ProbeError::Permission { what, summary, .. } = &e else { panic!("{e:?}") };
        assert_eq!(what, "sched_process_hang (sched_process_hang): load");
        assert!(
            summary.starts_with("the BPF_PROG_LOAD syscall failed.") && summary.contains(" … "),
            "{summary}"
        );
        let text = e.to_string();
        assert!(text.contains("missing CAP_") || text.contains("seccomp profile or LSM"), "{text}");
        assert!(!text.contains('\n'), "one line: {text}");

        let einval = LoadError(std::io::Error::from_raw_os_error(libc::EINVAL));
        assert!(matches!(ProbeError::bpf("x", &einval, true), ProbeError::Refused { .. }));
        // An fentry's EPERM is the kernel's, not the caller's.
        assert!(matches!(ProbeError::bpf("x", &eperm, false), ProbeError::Refused { .. }));
    }

    #[test]
    fn the_permission_hint_names_what_is_missing() {
        let e = ProbeError::Permission {
            what: "load".into(),
            summary: "denied".into(),
            missing: vec!["CAP_BPF"],
        };
        assert_eq!(e.to_string(), "load: denied (missing CAP_BPF)");
        let e = ProbeError::Permission { what: "load".into(), summary: "denied".into(), missing: vec![] };
        assert!(e.to_string().contains("a seccomp profile or LSM refused bpf()"), "{e}");
    }
}
