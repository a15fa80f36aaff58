//! `--repeat N`: the same tests run back to back, and what a flake hunt needs at the end — each
//! run's result and wall time, and the pass rate of every test that failed even once.

use std::{collections::BTreeMap, time::Duration};

use crate::libtest::Failure;

/// The runs so far. A test is named as the runner names it (for the matrix: kernel and scenario).
#[derive(Default)]
pub struct Tally {
    runs: Vec<Run>,
}

struct Run {
    wall: Duration,
    passed: Vec<String>,
    failed: Vec<Failure>,
}

impl Tally {
    pub fn record(&mut self, wall: Duration, passed: Vec<String>, failed: Vec<Failure>) {
        self.runs.push(Run { wall, passed, failed });
    }

    pub fn all_passed(&self) -> bool {
        self.runs.iter().all(|r| r.failed.is_empty())
    }

    /// `what: 5 runs, 4 passed; wall 290 s, 301 s, ...` and a line per test that failed at least
    /// once: its pass rate and the first failure's reason.
    pub fn summary(&self, what: &str) -> String {
        let green = self.runs.iter().filter(|r| r.failed.is_empty()).count();
        let walls: Vec<String> = self.runs.iter().map(|r| format!("{:.0} s", r.wall.as_secs_f64())).collect();
        let mut text =
            format!("{what}: {} run(s), {green} passed; wall {}\n", self.runs.len(), walls.join(", "));
        let mut flaky: BTreeMap<&str, PassRate> = BTreeMap::new();
        for (i, run) in self.runs.iter().enumerate() {
            for failure in &run.failed {
                let rate = flaky.entry(&failure.test).or_default();
                rate.ran += 1;
                rate.first_failure.get_or_insert((i + 1, &failure.why));
            }
        }
        for run in &self.runs {
            for test in &run.passed {
                if let Some(rate) = flaky.get_mut(test.as_str()) {
                    rate.passed += 1;
                    rate.ran += 1;
                }
            }
        }
        for (test, rate) in flaky {
            let (run, why) = rate.first_failure.unwrap_or_default();
            text.push_str(&format!("  {test}: passed {} of {} (run {run}: {why})\n", rate.passed, rate.ran));
        }
        text
    }
}

/// A test that failed at least once: the runs it passed and ran, and its first failure (run, why).
#[derive(Default)]
struct PassRate<'a> {
    passed: usize,
    ran: usize,
    first_failure: Option<(usize, &'a str)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pass_rates_of_the_tests_that_failed() {
        let mut tally = Tally::default();
        let failure = || vec![Failure { test: "b".into(), why: "x.rs:3: boom".into() }];
        tally.record(Duration::from_secs(290), vec!["a".into(), "b".into()], vec![]);
        tally.record(Duration::from_secs(301), vec!["a".into()], failure());
        tally.record(Duration::from_secs(295), vec!["a".into(), "b".into()], vec![]);
        assert!(!tally.all_passed());
        assert_eq!(
            tally.summary("vm-test"),
            "vm-test: 3 run(s), 2 passed; wall 290 s, 301 s, 295 s\n  b: passed 2 of 3 (run 2: x.rs:3: boom)\n"
        );
    }
}
