//! Reads what Rust test binaries print (libtest's text output, one or many binaries): which tests
//! passed and failed, why each failure failed in one line, and the test that never finished.

/// What one or more test binaries printed.
#[derive(Debug, Default, PartialEq)]
pub struct Results {
    pub passed: Vec<String>,
    pub failed: Vec<Failure>,
    /// Started but never reported (the binary was killed, e.g. by a timeout).
    pub unfinished: Option<String>,
    /// The VM scenarios' `vm-scenario` report lines.
    pub reports: Vec<String>,
    /// The VM scenarios' `vm-time-to-name <signature> <seconds>` lines: how long each incident
    /// took from its first kernel signal to firing.
    pub times_to_name: Vec<(String, f64)>,
    /// The VM scenarios' `vm-bench <name> <figures>` lines: what a benchmark run in the guest
    /// measured, by benchmark.
    pub benches: Vec<(String, String)>,
}

#[derive(Debug, PartialEq)]
pub struct Failure {
    pub test: String,
    /// Where it panicked and the assertion's first line: `tests/tests/x.rs:161: assertion ...`.
    pub why: String,
}

/// Longest explanation kept for a failure: the line has to fit a terminal and a CI summary.
const WHY_MAX: usize = 240;

impl Results {
    pub fn parse(log: &str) -> Self {
        let mut results = Results::default();
        let mut failed = Vec::new();
        for line in log.lines() {
            if let Some(report) = line.strip_prefix("vm-scenario ") {
                results.reports.push(report.to_string());
            } else if let Some((bench, figures)) =
                line.strip_prefix("vm-bench ").and_then(|l| l.split_once(' '))
            {
                results.benches.push((bench.to_string(), figures.to_string()));
            } else if let Some((signature, secs)) =
                line.strip_prefix("vm-time-to-name ").and_then(|l| l.split_once(' '))
            {
                if let Ok(secs) = secs.trim().parse() {
                    results.times_to_name.push((signature.to_string(), secs));
                }
            } else if let Some((name, result)) = line.strip_prefix("test ").and_then(|l| l.split_once(" ..."))
            {
                results.unfinished = None;
                match result.trim() {
                    "ok" => results.passed.push(name.to_string()),
                    "FAILED" => failed.push(name.to_string()),
                    // `--test-threads=1` prints the name first and the result when the test ends.
                    "" => results.unfinished = Some(name.to_string()),
                    _ => {}
                }
            }
        }
        results.failed = failed.into_iter().map(|test| Failure { why: why(log, &test), test }).collect();
        results
    }
}

/// The panic of `test` in libtest's failures section, as one line.
fn why(log: &str, test: &str) -> String {
    let header = format!("---- {test} stdout ----");
    let Some(start) = log.find(&header) else { return "no panic message (see the log)".into() };
    let section = &log[start + header.len()..];
    let section = &section[..section.find("\n---- ").unwrap_or(section.len())];
    let mut lines =
        section.lines().skip_while(|l| !l.contains("' panicked at ") && !l.contains(") panicked at "));
    let Some(panicked) = lines.next() else { return "no panic message (see the log)".into() };
    // `thread 'name' (tid) panicked at tests/tests/x.rs:161:9:`, the tid only on newer Rust.
    let location = panicked.split_once("panicked at ").map_or("", |(_, at)| at.trim_end_matches(':'));
    let location = location.rsplit_once(':').map_or(location, |(file_line, _column)| file_line);
    let mut message: Vec<&str> = Vec::new();
    for line in lines {
        let line = line.trim();
        if line.starts_with("note: run with") || line.starts_with("stack backtrace") {
            break;
        }
        // An assertion's message first, then its two sides: those say most.
        if message.is_empty() || line.starts_with("left:") || line.starts_with("right:") {
            message.push(line);
        }
    }
    let mut why = format!("{location}: {}", message.join(" "));
    if why.len() > WHY_MAX {
        let cut = (0..=WHY_MAX).rev().find(|&i| why.is_char_boundary(i)).unwrap_or(0);
        why.truncate(cut);
        why.push('…');
    }
    why
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_reports_and_one_line_per_failure() {
        // libtest with --show-output: results first, then passing tests' output, then failures.
        let log = "running 3 tests\n\
                   test a_scenario ... ok\n\
                   test b_scenario ... FAILED\n\
                   test c_scenario ... FAILED\n\
                   \nsuccesses:\n\n---- a_scenario stdout ----\nvm-scenario a: fired\n\
                   vm-time-to-name nfs-sidecar-redirect 4.25\nvm-time-to-name garbled\n\
                   vm-bench nfs-rpc 100 RPCs | 5/s\n\n\
                   \nfailures:\n\n---- b_scenario stdout ----\nsome output\n\
                   thread 'b_scenario' (812) panicked at tests/tests/vm_scenarios.rs:161:9:\n\
                   assertion `left == right` failed: {\n  \"comm\": \"socat\"\n}\n  left: Null\n right: Number(2049)\n\
                   note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\n\
                   ---- c_scenario stdout ----\n\
                   thread 'c_scenario' panicked at tests/src/nfs.rs:12:5:\nno incident\n\n\
                   test result: FAILED. 1 passed; 2 failed\n";
        let r = Results::parse(log);
        assert_eq!(r.passed, ["a_scenario"]);
        assert_eq!(r.reports, ["a: fired"]);
        assert_eq!(r.times_to_name, [("nfs-sidecar-redirect".to_string(), 4.25)]);
        assert_eq!(r.benches, [("nfs-rpc".to_string(), "100 RPCs | 5/s".to_string())]);
        assert_eq!(r.unfinished, None);
        assert_eq!(
            r.failed,
            [
                Failure {
                    test: "b_scenario".into(),
                    why: "tests/tests/vm_scenarios.rs:161: assertion `left == right` failed: { left: Null right: \
                          Number(2049)"
                        .into()
                },
                Failure { test: "c_scenario".into(), why: "tests/src/nfs.rs:12: no incident".into() },
            ]
        );
    }

    #[test]
    fn a_test_killed_midway_is_named() {
        let r = Results::parse("running 2 tests\ntest a ... ok\ntest b ... ");
        assert_eq!((r.passed, r.unfinished), (vec!["a".to_string()], Some("b".to_string())));
    }
}
