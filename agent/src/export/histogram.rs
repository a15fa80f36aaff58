//! A histogram family whose observations arrive counted: what a histogram in the kernel added up
//! in an interval (RPCs per bucket and their sum), which prometheus's `Histogram` could only take
//! one value at a time.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex},
};

use prometheus::{
    core::{Collector, Desc},
    proto,
};

use super::event_counters::label_pairs;

#[derive(Clone)]
pub struct CountedHistogramVec {
    desc: Desc,
    bounds: Arc<[f64]>,
    series: Arc<Mutex<BTreeMap<Vec<String>, Series>>>,
}

#[derive(Default)]
struct Series {
    /// Per bucket, not cumulative: one per bound and the last past them.
    buckets: Vec<u64>,
    sum: f64,
}

impl CountedHistogramVec {
    pub fn new(name: &str, help: &str, labels: &[&str], bounds: &[f64]) -> prometheus::Result<Self> {
        let desc = Desc::new(
            name.into(),
            help.into(),
            labels.iter().map(|l| l.to_string()).collect(),
            Default::default(),
        )?;
        Ok(Self { desc, bounds: bounds.into(), series: Arc::default() })
    }

    /// Adds `counts` (per bucket, one per bound and the last past them; extra ones count past
    /// the last bound) and their `sum` to the series of `labels`.
    pub fn add(&self, labels: &[&str], counts: &[u64], sum: f64) {
        let mut series = self.series.lock().expect("histogram series");
        let key: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        let s =
            series.entry(key).or_insert_with(|| Series { buckets: vec![0; self.bounds.len() + 1], sum: 0.0 });
        for (i, n) in counts.iter().enumerate() {
            let slot = &mut s.buckets[i.min(self.bounds.len())];
            *slot = slot.saturating_add(*n);
        }
        s.sum += sum;
    }

    pub fn remove(&self, labels: &[&str]) {
        let key: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        self.series.lock().expect("histogram series").remove(&key);
    }
}

impl Collector for CountedHistogramVec {
    fn desc(&self) -> Vec<&Desc> {
        vec![&self.desc]
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let series = self.series.lock().expect("histogram series");
        let metrics = series
            .iter()
            .map(|(labels, s)| {
                let pairs = label_pairs(&self.desc, labels.iter().map(String::as_str));
                let mut histogram = proto::Histogram::default();
                let mut cumulative = 0u64;
                let buckets = self
                    .bounds
                    .iter()
                    .zip(&s.buckets)
                    .map(|(bound, n)| {
                        cumulative = cumulative.saturating_add(*n);
                        let mut bucket = proto::Bucket::default();
                        bucket.set_cumulative_count(cumulative);
                        bucket.set_upper_bound(*bound);
                        bucket
                    })
                    .collect();
                histogram.set_bucket(buckets);
                histogram.set_sample_count(s.buckets.iter().fold(0u64, |sum, n| sum.saturating_add(*n)));
                histogram.set_sample_sum(s.sum);
                let mut metric = proto::Metric::from_label(pairs);
                metric.set_histogram(histogram);
                metric
            })
            .collect();
        let mut family = proto::MetricFamily::default();
        family.set_name(self.desc.fq_name.clone());
        family.set_help(self.desc.help.clone());
        family.set_field_type(proto::MetricType::HISTOGRAM);
        family.set_metric(metrics);
        vec![family]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_buckets_export_as_a_cumulative_histogram() {
        let h = CountedHistogramVec::new("rpc_seconds", "RPCs.", &["op"], &[0.001, 1.0]).unwrap();
        h.add(&["READ"], &[8, 0, 2], 2.5);
        h.add(&["READ"], &[1, 1, 0], 0.5);
        h.add(&["WRITE"], &[0, 3], 1.2);
        let registry = prometheus::Registry::new();
        registry.register(Box::new(h.clone())).unwrap();
        let mut text = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut text).unwrap();
        let text = String::from_utf8(text).unwrap();
        for line in [
            "# TYPE rpc_seconds histogram",
            "rpc_seconds_bucket{op=\"READ\",le=\"0.001\"} 9",
            "rpc_seconds_bucket{op=\"READ\",le=\"1\"} 10",
            "rpc_seconds_bucket{op=\"READ\",le=\"+Inf\"} 12",
            "rpc_seconds_sum{op=\"READ\"} 3",
            "rpc_seconds_count{op=\"READ\"} 12",
            "rpc_seconds_bucket{op=\"WRITE\",le=\"1\"} 3",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        h.remove(&["READ"]);
        let families = registry.gather();
        assert_eq!(families[0].get_metric().len(), 1, "READ's series is gone");
    }
}
