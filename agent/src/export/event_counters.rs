//! The counter families about events, exported from the series book at each scrape. The book
//! already holds every series' labels and count (it decides which may exist); prometheus's own
//! vectors would keep a second copy and build and validate a descriptor for each new series: 40%
//! of the agent's time in a storm of new series, profiled (issue 58).

use std::sync::{Arc, Mutex};

use prometheus::{
    core::{Collector, Desc},
    proto,
};

use super::series::{Family, SeriesBook};

#[derive(Clone)]
pub struct EventCounters {
    book: Arc<Mutex<SeriesBook>>,
    /// One per counter family, with its labels as exported (its own, then the pod labels).
    descs: Vec<(Family, Desc)>,
}

impl EventCounters {
    pub fn new(book: Arc<Mutex<SeriesBook>>) -> prometheus::Result<Self> {
        let descs = Family::ALL
            .into_iter()
            .filter(|f| f.is_counter())
            .map(|family| {
                let metric = family.metric();
                let labels = family.labels().iter().chain(&super::series::POD_LABELS).map(|l| l.to_string());
                Desc::new(metric.name.into(), metric.help.into(), labels.collect(), Default::default())
                    .map(|desc| (family, desc))
            })
            .collect::<prometheus::Result<_>>()?;
        Ok(Self { book, descs })
    }
}

impl Collector for EventCounters {
    fn desc(&self) -> Vec<&Desc> {
        self.descs.iter().map(|(_, desc)| desc).collect()
    }

    fn collect(&self) -> Vec<proto::MetricFamily> {
        let book = self.book.lock().expect("series book");
        self.descs
            .iter()
            .map(|(family, desc)| {
                let overflow_labels = family.overflow_labels();
                let overflow = book.overflowed(*family).map(|n| (overflow_labels.as_slice(), n));
                let series = book.series_of(*family).map(|e| (e.labels.as_slice(), e.value.max(0) as u64));
                let metrics = series
                    .map(|(labels, value)| counter(desc, labels.iter().map(String::as_str), value))
                    .chain(overflow.map(|(labels, value)| counter(desc, labels.iter().copied(), value)))
                    .collect();
                let mut mf = proto::MetricFamily::default();
                mf.set_name(desc.fq_name.clone());
                mf.set_help(desc.help.clone());
                mf.set_field_type(proto::MetricType::COUNTER);
                mf.set_metric(metrics);
                mf
            })
            .collect()
    }
}

/// One series.
fn counter<'a>(desc: &Desc, values: impl Iterator<Item = &'a str>, value: u64) -> proto::Metric {
    let pairs = label_pairs(desc, values);
    let mut counter = proto::Counter::default();
    counter.set_value(value as f64);
    let mut metric = proto::Metric::from_label(pairs);
    metric.set_counter(counter);
    metric
}

/// A series' label pairs: `desc`'s names with `values`, sorted by name, as the crate's own
/// collectors write them.
pub(super) fn label_pairs<'a>(desc: &Desc, values: impl Iterator<Item = &'a str>) -> Vec<proto::LabelPair> {
    let mut pairs: Vec<proto::LabelPair> = desc
        .variable_labels
        .iter()
        .zip(values)
        .map(|(name, value)| {
            let mut pair = proto::LabelPair::default();
            pair.set_name(name.clone());
            pair.set_value(value.to_string());
            pair
        })
        .collect();
    pairs.sort_by(|a, b| a.name().cmp(b.name()));
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{attribution::Attribution, export::series::Settings};

    fn render(counters: &EventCounters) -> String {
        let registry = prometheus::Registry::new();
        registry.register(Box::new(counters.clone())).unwrap();
        let mut text = Vec::new();
        prometheus::Encoder::encode(&prometheus::TextEncoder::new(), &registry.gather(), &mut text).unwrap();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn a_counter_family_shows_its_books_series_and_its_overflow_and_nothing_while_empty() {
        let book = Arc::new(Mutex::new(SeriesBook::new(Settings { max_series_per_metric: 1 })));
        let counters = EventCounters::new(book.clone()).unwrap();
        assert_eq!(render(&counters), "", "no family shows before its first series");
        let who = Attribution { namespace: "shop".into(), pod: "web-1".into(), ..Default::default() };
        {
            let mut book = book.lock().unwrap();
            let labels = ["sent", "15001", "2049", "1", "shop", "web-1", "", "", "false"];
            let super::super::series::Admission::Series(slot) = book.admit(Family::TcpResets, &labels, &who)
            else {
                panic!("room for one series")
            };
            book.update(slot, |v| *v += 3);
            book.add_overflow(Family::TcpResets, 2);
        }
        let text = render(&counters);
        for line in [
            "# TYPE kstall_tcp_resets_total counter",
            r#"kstall_tcp_resets_total{container="",direction="sent",host="false",namespace="shop",original_port="2049",pod="web-1",port="15001",reason="1",workload=""} 3"#,
            r#"kstall_tcp_resets_total{container="",direction="overflow",host="",namespace="",original_port="overflow",pod="",port="overflow",reason="overflow",workload=""} 2"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from:\n{text}");
        }
        assert!(!text.contains("kstall_oom_kills_total"), "{text}");
    }
}
