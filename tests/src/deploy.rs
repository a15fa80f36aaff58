//! deploy/'s kustomize packages as a cluster gets them: rendered by the real `kubectl kustomize`
//! and parsed into JSON objects; and the offline validator of rendered objects
//! (tests/deploy/validate.py in target/deploy-venv), which tests/tests/deploy.rs and helm.rs share.

use std::{
    ffi::OsStr,
    io::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::OnceLock,
};

use serde::Deserialize as _;
use serde_json::{Value, json};

/// The repository's deploy/ directory.
pub fn deploy_dir() -> PathBuf {
    crate::workspace().join("deploy")
}

/// The objects `kubectl kustomize dir` renders, in its order, with the machine's kubectl. Panics
/// with kubectl's own error when it cannot render them, or cannot run.
pub fn render(dir: &Path) -> Vec<Value> {
    render_with(Path::new("kubectl"), dir)
}

/// As [`render`], with this `kubectl` (the pinned one of target/tools: [`crate::helm::kubectl`]).
pub fn render_with(kubectl: &Path, dir: &Path) -> Vec<Value> {
    let out = Command::new(kubectl).arg("kustomize").arg(dir).output().unwrap_or_else(|e| {
        panic!(
            "kubectl kustomize {}: cannot run {} (1.27+, with kustomize 5): {e}",
            dir.display(),
            kubectl.display()
        )
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl kustomize {}: {}", dir.display(), stderr.trim());
    yaml_documents(&String::from_utf8_lossy(&out.stdout))
}

/// Every document of a YAML stream as a JSON value, empty documents left out.
pub fn yaml_documents(text: &str) -> Vec<Value> {
    serde_yaml_ng::Deserializer::from_str(text)
        .map(|doc| Value::deserialize(doc).unwrap_or_else(|e| panic!("not YAML: {e}")))
        .filter(|v| !v.is_null())
        .collect()
}

/// The rendered DaemonSet of `overlay`: a directory of deploy/overlays (`plain-prometheus`,
/// `prometheus-operator`), or `base` for deploy/base.
pub fn rendered_daemonset(overlay: &str) -> Value {
    let dir = match overlay {
        "base" => deploy_dir().join("base"),
        _ => deploy_dir().join("overlays").join(overlay),
    };
    let mut daemonsets: Vec<Value> = render(&dir).into_iter().filter(|o| o["kind"] == "DaemonSet").collect();
    assert_eq!(daemonsets.len(), 1, "{overlay}: rendered {} DaemonSets, not one", daemonsets.len());
    daemonsets.remove(0)
}

/// The agent container's `resources.limits.memory` in the DaemonSet a cluster gets
/// (`plain-prometheus`), in bytes: what the kubelet holds the agent to.
pub fn agent_memory_limit() -> u64 {
    let daemonset = rendered_daemonset("plain-prometheus");
    let containers = daemonset["spec"]["template"]["spec"]["containers"].as_array().expect("containers");
    let agent = containers.iter().find(|c| c["name"] == "kstall").expect("the kstall container");
    let limit = agent["resources"]["limits"]["memory"].as_str().expect("a memory limit on the agent");
    quantity_bytes(limit).unwrap_or_else(|| panic!("{limit:?} is not a memory quantity this reads"))
}

/// A Kubernetes memory quantity (`160Mi`, `1Gi`, `500M`, `1048576`) in bytes.
fn quantity_bytes(quantity: &str) -> Option<u64> {
    let suffixes = [
        ("Ki", 1u64 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("k", 1000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
    ];
    let (number, unit) = suffixes
        .iter()
        .find_map(|(s, unit)| Some((quantity.strip_suffix(s)?, *unit)))
        .unwrap_or((quantity, 1));
    number.parse::<u64>().ok()?.checked_mul(unit)
}

/// `to` relative to `from`: kustomize takes no absolute paths.
pub fn relative(from: &Path, to: &Path) -> PathBuf {
    let (from, to) = (from.canonicalize().unwrap(), to.canonicalize().unwrap());
    let common = from.components().zip(to.components()).take_while(|(a, b)| a == b).count();
    let mut path: PathBuf = from.components().skip(common).map(|_| "..").collect();
    path.extend(to.components().skip(common));
    path
}

pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// As `cargo xtask test` decides for the kernel tests: root and CI must run everything, and a
/// missing tool fails the test instead of skipping it.
pub fn required() -> bool {
    std::env::var("KSTALL_KERNEL_TESTS").as_deref() == Ok("require")
        || std::env::var_os("CI").is_some()
        || is_root()
}

/// Whether `test` can run, `missing` saying what it lacks: when something is missing, prints why
/// and returns false — or panics with that one line where the test is [`required`].
pub fn runs_without(test: &str, missing: Option<String>) -> bool {
    match missing {
        None => true,
        Some(why) if required() => panic!("{test}: required here, but {why}"),
        Some(why) => {
            println!("skipping {test}: {why}");
            false
        }
    }
}

/// The venv's python, with tests/deploy/requirements.txt installed into target/deploy-venv: kept
/// while the requirements are those it was made with (a copy in it says). Installing needs PyPI;
/// validating does not.
pub fn validator_python() -> Result<PathBuf, String> {
    static PYTHON: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    PYTHON
        .get_or_init(|| {
            let here = Path::new(env!("CARGO_MANIFEST_DIR"));
            let requirements = here.join("deploy/requirements.txt");
            let venv = here.join("../target/deploy-venv");
            let (python, stamp) = (venv.join("bin/python"), venv.join("kstall-requirements.txt"));
            let wanted = std::fs::read_to_string(&requirements)
                .map_err(|e| format!("{}: {e}", requirements.display()))?;
            if python.exists() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(wanted.as_str()) {
                return Ok(python);
            }
            println!("installing the manifest validator into {}", venv.display());
            let _ = std::fs::remove_dir_all(&venv);
            install(Command::new("python3").args(["-m", "venv"]).arg(&venv), "python3 -m venv")?;
            install(
                Command::new(&python)
                    .args([
                        "-m",
                        "pip",
                        "install",
                        "--quiet",
                        "--disable-pip-version-check",
                        "--only-binary=:all:",
                    ])
                    .arg("-r")
                    .arg(&requirements),
                "pip install -r tests/deploy/requirements.txt (no network to PyPI?)",
            )?;
            std::fs::write(&stamp, wanted).map_err(|e| format!("{}: {e}", stamp.display()))?;
            Ok(python)
        })
        .clone()
}

fn install(cmd: &mut Command, what: &str) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{what}: cannot run: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    let stderr = String::from_utf8_lossy(&out.stderr);
    Err(format!("{what} failed: {}", stderr.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("").trim()))
}

/// tests/deploy/validate.py on `objects` (where each came from, the object): whether all are
/// valid, and its lines, one per object. As root it runs in a network namespace of its own with no
/// network at all: the validation must need none. Panics when the validator is not installed
/// ([`validator_python`] says why).
pub fn validate(objects: &[(String, Value)]) -> (bool, String) {
    let python = validator_python().unwrap_or_else(|why| panic!("the validator: {why}"));
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/validate.py");
    offline(&python, &[script.as_os_str()], objects)
}

/// `program` with `args` on `objects` (where each came from, the object) as a JSON list on stdin:
/// whether all are valid, and its lines, one per object. As root it runs in a network namespace of
/// its own with no network at all: the validation must need none.
pub fn offline(program: &Path, args: &[&OsStr], objects: &[(String, Value)]) -> (bool, String) {
    let mut cmd = if is_root() { Command::new("unshare") } else { Command::new(program) };
    if is_root() {
        cmd.args(["--net", "--"]).arg(program);
    }
    let mut child = cmd
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    let input: Vec<Value> =
        objects.iter().map(|(source, object)| json!({"source": source, "object": object})).collect();
    // It reads all its input before it writes: no deadlock on full pipes.
    child
        .stdin
        .take()
        .expect("piped")
        .write_all(Value::Array(input).to_string().as_bytes())
        .expect("to the validator");
    let out = child.wait_with_output().expect("the validator");
    let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), report)
}

#[cfg(test)]
mod tests {
    use super::quantity_bytes;

    #[test]
    fn memory_quantities_are_read_in_bytes() {
        assert_eq!(quantity_bytes("160Mi"), Some(160 << 20));
        assert_eq!(quantity_bytes("1Gi"), Some(1 << 30));
        assert_eq!(quantity_bytes("500M"), Some(500_000_000));
        assert_eq!(quantity_bytes("1048576"), Some(1 << 20));
        assert_eq!(quantity_bytes("lots"), None);
        assert_eq!(quantity_bytes("1.5Gi"), None);
    }
}
