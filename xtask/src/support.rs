//! The kernel support table of `docs/kernel-support.md`, made from what the agent reported on each
//! kernel of the matrix (`kstall status --output json` in the guest): the hooks each probe used and
//! the fields it said the kernel cannot give. A full, green `vm-test` compares it with the
//! document's and, where they differ, rewrites the document and fails — so the table is always
//! what was last tested.

use std::path::{Path, PathBuf};

use crate::{arch::Arch, build, generated};

/// The document that carries the table, from the workspace's root.
pub const DOC: &str = "docs/kernel-support.md";

/// [`DOC`]'s path.
pub fn doc() -> PathBuf {
    build::workspace_root().join(DOC)
}

/// One tested kernel: how the table names it, its architecture and the agent's status there.
pub struct Tested<'a> {
    pub label: &'a str,
    pub arch: Arch,
    pub status: &'a serde_json::Value,
}

/// The markdown table: a row per kernel and probe.
pub fn table(kernels: &[Tested]) -> String {
    let mut out = String::from(
        "| arch | kernel | probe | hooks | unavailable on this kernel |\n|---|---|---|---|---|\n",
    );
    for kernel in kernels {
        let version = kernel.status["kernel"].as_str().unwrap_or("?");
        for (i, probe) in kernel.status["probes"].as_array().into_iter().flatten().enumerate() {
            let (arch, first) = if i == 0 {
                (kernel.arch.name(), format!("{version} ({})", kernel.label))
            } else {
                ("", String::new())
            };
            let hook = if probe["up"] == true {
                probe["hook"].as_str().unwrap_or("").to_string()
            } else {
                format!("**down**: {}", probe["reason"].as_str().unwrap_or("?"))
            };
            let missing: Vec<String> = probe["unavailable"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|u| {
                    format!("`{}`: {}", u["field"].as_str().unwrap_or("?"), u["why"].as_str().unwrap_or("?"))
                })
                .collect();
            let missing = if missing.is_empty() { "—".to_string() } else { missing.join("; ") };
            out.push_str(&format!(
                "| {arch} | {} | {} | {} | {} |\n",
                cell(&first),
                cell(probe["name"].as_str().unwrap_or("?")),
                cell(&hook),
                cell(&missing)
            ));
        }
    }
    out
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

/// Writes `table` into `doc`'s kernel-support section; whether it said something else before.
pub fn update_doc(doc: &Path, table: &str) -> anyhow::Result<bool> {
    generated::write(doc, "kernel-support", table)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status() -> serde_json::Value {
        serde_json::json!({
            "kernel": "5.10.0-46-amd64",
            "probes": [
                {"name": "tcp-reset", "up": true, "hook": "tp_btf/a + fentry/{b,c}",
                 "unavailable": [{"field": "reason", "why": "none before 6.10"}]},
                {"name": "nfs", "up": false, "reason": "x | y"},
            ]
        })
    }

    #[test]
    fn a_row_per_probe_naming_hooks_and_missing_fields() {
        let status = status();
        let text = table(&[Tested { label: "Debian 11", arch: Arch::Amd64, status: &status }]);
        let rows: Vec<&str> = text.lines().collect();
        assert_eq!(
            rows[2],
            "| amd64 | 5.10.0-46-amd64 (Debian 11) | tcp-reset | tp_btf/a + fentry/{b,c} | `reason`: none before 6.10 |"
        );
        assert_eq!(rows[3], "|  |  | nfs | **down**: x \\| y | — |");
    }

    /// `vm-test` writes the table where the committed document carries it: a document moved or a
    /// section lost fails here, not at the end of a full matrix.
    #[test]
    fn the_document_carries_the_tables_section() {
        let text = std::fs::read_to_string(doc()).unwrap();
        let table = text
            .split("<!-- kernel-support:begin")
            .nth(1)
            .and_then(|rest| rest.split("<!-- kernel-support:end -->").next())
            .unwrap_or_else(|| panic!("{DOC} has no kernel-support section"));
        assert!(
            table.contains("| arch | kernel | probe | hooks | unavailable on this kernel |"),
            "{DOC}'s kernel-support section holds no table"
        );
        assert!(
            !std::fs::read_to_string(build::workspace_root().join("README.md"))
                .unwrap()
                .contains("kernel-support:begin"),
            "README.md carries a kernel-support section too: the table lives in {DOC}"
        );
    }
}
