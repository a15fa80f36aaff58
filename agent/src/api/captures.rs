//! The socket's capture requests (`kstall capture`): the pod named is found in the attribution
//! index ([`explain::find`]), its network namespace opened (`capture::target`), and the capture
//! handed to `capture::service`, which runs it on a thread of its own. A wait polls; nothing here
//! blocks the runtime for longer than a `/proc` read.

use std::{path::Path, time::Duration};

use serde::{Deserialize, Serialize};

use super::explain;
use crate::{
    attribution::Index,
    capture::{self, runner::Target, service::Info},
};

/// `{"capture": …}`: one capture.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CaptureReply {
    pub capture: Info,
}

/// `{"captures": [...]}`: the bundles kept, the failed captures, the running ones.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CapturesReply {
    pub captures: Vec<Info>,
}

/// How often a wait looks again.
pub const POLL: Duration = Duration::from_millis(250);

/// What is captured of pod `query` (name or UID, in `namespace` when given): see
/// [`capture::target::of_pod`]; or the one line saying why not.
pub fn target(index: &Index, query: &str, namespace: Option<&str>, proc: &Path) -> Result<Target, String> {
    capture::target::of_pod(index, explain::find(index, query, namespace)?, proc)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_pod_is_refused_naming_what_is_known() {
        let e = target(&Index::default(), "web-2", None, Path::new("/proc")).err().unwrap();
        assert_eq!(e, "kstall knows no pod \"web-2\" on this node (0 pods known)");
    }
}
