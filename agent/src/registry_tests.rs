//! Generated from the probe registry (`probes::ALL`): every event kind of every probe has a
//! sample, renders as its own line in `kstall trace` (text, from the agent's JSON), is matched by
//! the trace filters, and feeds only the metric families its kind declares, each of them fed by
//! some sample. A probe added to the registry is held to all of it without a line here.

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
};

use crate::{
    api::filter::TraceFilter,
    attribution::{Attributed, Attribution},
    cli::trace::render,
    events::{Counts, Event, Header, Payload},
    export::metrics::Metrics,
    probes,
};

fn attributed(probe: &'static str, payload: Payload) -> Attributed {
    let header = Header {
        probe,
        time_unix_ns: 1_796_013_722_123_000_000,
        tgid: 4242,
        pid: 4243,
        comm: "app".into(),
        cgroup_id: 7,
        netns: 4026532999,
    };
    let who = Attribution {
        namespace: "shop".into(),
        pod: "web-1".into(),
        pod_uid: Some("u-1".into()),
        container: "app".into(),
        ..Default::default()
    };
    Attributed { event: Event { header, payload }, who: Arc::new(who) }
}

/// `family -> value` of every sample line in the exposition text (a histogram's lines under
/// its name).
fn series(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.rsplit_once(' '))
        .map(|(series, value)| (series.to_string(), value.to_string()))
        .collect()
}

fn family_of(series: &str) -> &str {
    let name = series.split('{').next().unwrap_or(series);
    ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(name)
}

#[test]
fn every_event_kind_of_every_probe_has_a_sample() {
    for probe in probes::ALL {
        let declared: BTreeSet<&str> = probe.events().iter().map(|k| k.name).collect();
        let sampled: BTreeSet<&str> = probe.samples().iter().map(|p| p.kind().name).collect();
        assert_eq!(declared, sampled, "{}: its declared event kinds and its samples' kinds", probe.name());
        let same_record = probes::ALL.iter().filter(|p| p.record_kind() == probe.record_kind()).count();
        assert_eq!(same_record, 1, "{}: its record kind is another probe's too", probe.name());
    }
}

#[test]
fn every_event_kind_renders_in_trace_text_and_json() {
    for probe in probes::ALL {
        for payload in probe.samples() {
            let kind = payload.kind().name;
            let json = serde_json::to_value(attributed(probe.name(), payload)).unwrap();
            assert_eq!(json["kind"], kind, "{}: the JSON's kind", probe.name());
            assert_eq!(json["probe"], probe.name());
            assert_eq!(json["pod"], "web-1");
            let line = render(&json);
            assert!(!line.contains("no text for it"), "{}/{kind} has no trace text: {line}", probe.name());
            assert!(line.contains("shop/web-1/app") && line.contains(probe.name()), "{kind}: {line}");
            let what = line.split(probe.name()).nth(1).unwrap_or("").trim();
            assert!(
                what.len() > kind.len() && !what.contains(" ? "),
                "{kind}: no fields in its text: {line}"
            );
        }
    }
}

#[test]
fn every_event_kind_is_filterable() {
    let other = |name: &str| probes::names().find(|n| *n != name).unwrap().to_string();
    for probe in probes::ALL {
        for payload in probe.samples() {
            let kind = payload.kind().name;
            let fields = payload.data().filter_fields();
            let event = attributed(probe.name(), payload);
            let matches = |filter: TraceFilter| filter.matches(&event);
            let name = probe.name().to_string();
            assert!(matches(TraceFilter { probes: vec![name.clone()], ..Default::default() }), "{kind}");
            assert!(!matches(TraceFilter { probes: vec![other(&name)], ..Default::default() }), "{kind}");
            assert!(matches(TraceFilter { namespace: Some("shop".into()), ..Default::default() }), "{kind}");
            assert!(
                !matches(TraceFilter { namespace: Some("default".into()), ..Default::default() }),
                "{kind}"
            );
            assert!(matches(TraceFilter { pod: Some("u-1".into()), ..Default::default() }), "{kind}");
            assert!(matches(TraceFilter { container: Some("app".into()), ..Default::default() }), "{kind}");
            assert!(matches(TraceFilter { pid: Some(4243), ..Default::default() }), "{kind}");
            assert!(!matches(TraceFilter { pid: Some(1), ..Default::default() }), "{kind}");
            for &port in &fields.ports {
                assert!(
                    matches(TraceFilter { port: Some(port), ..Default::default() }),
                    "{kind} port {port}"
                );
            }
            let absent = (1..=u16::MAX).find(|p| !fields.ports.contains(p)).unwrap();
            assert!(!matches(TraceFilter { port: Some(absent), ..Default::default() }), "{kind}");
            for addr in &fields.addrs {
                assert!(matches(TraceFilter { server: Some(addr.clone()), ..Default::default() }), "{kind}");
            }
            assert!(
                !matches(TraceFilter { server: Some("192.0.2.99".into()), ..Default::default() }),
                "{kind}"
            );
        }
    }
}

/// The families an event kind feeds are the ones it declares: no sample writes another, and
/// each declared one is written by some sample of the kind (so it exists in `/metrics`).
#[test]
fn every_event_kind_feeds_the_metric_families_it_declares() {
    // The agent's own bookkeeping of a count's suppressed events is not an event family.
    const BOOKKEEPING: &[&str] = &["kstall_events_suppressed_total"];
    for probe in probes::ALL {
        let mut fed: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
        for payload in probe.samples() {
            let kind = payload.kind();
            let metrics = Metrics::new(Arc::new(Counts::default()), Default::default());
            let before = series(&metrics.render());
            metrics.observe(&attributed(probe.name(), payload));
            let after = series(&metrics.render());
            let changed: BTreeSet<String> = after
                .iter()
                .filter(|(s, v)| before.get(*s) != Some(*v))
                .map(|(s, _)| family_of(s).to_string())
                .filter(|f| !BOOKKEEPING.contains(&f.as_str()))
                .collect();
            for family in &changed {
                assert!(
                    kind.families.iter().any(|m| m.name == family),
                    "{}/{}: feeds {family}, which its kind does not declare",
                    probe.name(),
                    kind.name
                );
            }
            fed.entry(kind.name).or_default().extend(changed);
        }
        for kind in probe.events() {
            for family in kind.families {
                assert!(
                    fed.get(kind.name).is_some_and(|f| f.contains(family.name)),
                    "{}/{}: declares {}, which no sample fed",
                    probe.name(),
                    kind.name,
                    family.name
                );
            }
        }
    }
}
