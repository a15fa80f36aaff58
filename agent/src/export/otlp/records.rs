//! kstall's records as OTLP log records, grouped by whom they are about: one resource per pod
//! (`k8s.pod.name`, `k8s.namespace.name`, `k8s.pod.uid`), one for the node's own (host processes,
//! node-wide incidents), each with `k8s.node.name`, `service.name` and the user's
//! `OTEL_RESOURCE_ATTRIBUTES` — a pipeline routes and indexes them as it does the pod's own logs.
//!
//! The body is the kstall/v1 record as the JSON stream writes it (`event`, or `transition` and
//! `incident`) as an OTLP map; `event_name` says what it is (`kstall.tcp_reset`,
//! `kstall.incident.fired`), the severity how bad (an incident's, events INFO).

use std::collections::BTreeMap;

use opentelemetry_proto::tonic::{
    collector::logs::v1::ExportLogsServiceRequest,
    common::v1::{AnyValue, ArrayValue, InstrumentationScope, KeyValue, KeyValueList, any_value::Value},
    logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber},
    resource::v1::Resource,
};

use crate::{
    export::stream::{Body, Record, SCHEMA, Transition},
    incidents::{Severity, engine::CAPTURE},
};

/// Whom records are about: a pod, or the node itself (all empty).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
struct Subject {
    namespace: String,
    pod: String,
    pod_uid: String,
}

/// The records of one export, by subject, and how many of each `record` label it holds.
#[derive(Default)]
pub struct Batch {
    by_subject: BTreeMap<Subject, Vec<LogRecord>>,
    events: u64,
    incidents: u64,
}

impl Batch {
    pub fn len(&self) -> usize {
        (self.events + self.incidents) as usize
    }

    /// Counts by the `record` label: events, incidents.
    pub fn counts(&self) -> [(&'static str, u64); 2] {
        [("event", self.events), ("incident", self.incidents)]
    }

    pub fn push(&mut self, record: &Record, observed_unix_ns: u64) {
        let (subject, name, severity) = match &record.body {
            Body::Event { event } => {
                let who = &event.who;
                let subject = Subject {
                    namespace: who.namespace.clone(),
                    pod: who.pod.clone(),
                    pod_uid: who.pod_uid.clone().unwrap_or_default(),
                };
                (subject, format!("kstall.{}", event.event.payload.kind().name), SeverityNumber::Info)
            }
            Body::Incident { transition, incident } => {
                let subject = Subject {
                    namespace: incident.namespace.clone(),
                    pod: incident.pod.clone(),
                    pod_uid: incident.pod_uid.clone().unwrap_or_default(),
                };
                let severity = match (transition, incident.severity) {
                    (Transition::Resolved, _) => SeverityNumber::Info,
                    (Transition::Fired, Severity::Warning) => SeverityNumber::Warn,
                    (Transition::Fired, Severity::Critical) => SeverityNumber::Error,
                };
                let name = match transition {
                    Transition::Fired => "kstall.incident.fired",
                    Transition::Resolved => "kstall.incident.resolved",
                };
                (subject, name.to_string(), severity)
            }
        };
        let body = serde_json::to_value(&record.body).map(|v| any(&v)).ok();
        let mut attributes = vec![
            string("kstall.schema", SCHEMA),
            string("kstall.record", record.body.record()),
            int("kstall.seq", record.seq as i64),
        ];
        // Where the incident's capture is (`--capture-on`): a query finds it without the body.
        if let Body::Incident { incident, .. } = &record.body
            && let Some(path) = incident.evidence[CAPTURE]["path"].as_str()
        {
            attributes.push(string("kstall.capture.path", path));
        }
        let log = LogRecord {
            time_unix_nano: record.time_unix_ns,
            observed_time_unix_nano: observed_unix_ns,
            severity_number: severity as i32,
            severity_text: severity.as_str_name().trim_start_matches("SEVERITY_NUMBER_").to_string(),
            body,
            attributes,
            event_name: name,
            ..Default::default()
        };
        self.by_subject.entry(subject).or_default().push(log);
        match record.body {
            Body::Event { .. } => self.events += 1,
            Body::Incident { .. } => self.incidents += 1,
        }
    }

    /// The export request: one resource a subject, kstall's scope in each.
    pub fn into_request(
        self,
        node: &str,
        service_name: &str,
        extra: &[(String, String)],
    ) -> ExportLogsServiceRequest {
        let scope = InstrumentationScope {
            name: "kstall".into(),
            version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
        let resource_logs = self
            .by_subject
            .into_iter()
            .map(|(subject, log_records)| {
                let mut attributes: Vec<KeyValue> =
                    extra.iter().filter(|(k, _)| k != "service.name").map(|(k, v)| string(k, v)).collect();
                attributes.push(string("service.name", service_name));
                attributes.push(string("k8s.node.name", node));
                if !subject.pod.is_empty() {
                    attributes.push(string("k8s.namespace.name", &subject.namespace));
                    attributes.push(string("k8s.pod.name", &subject.pod));
                }
                if !subject.pod_uid.is_empty() {
                    attributes.push(string("k8s.pod.uid", &subject.pod_uid));
                }
                ResourceLogs {
                    resource: Some(Resource { attributes, ..Default::default() }),
                    scope_logs: vec![ScopeLogs {
                        scope: Some(scope.clone()),
                        log_records,
                        ..Default::default()
                    }],
                    ..Default::default()
                }
            })
            .collect();
        ExportLogsServiceRequest { resource_logs }
    }
}

fn string(key: &str, value: &str) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(Value::StringValue(value.into())) }),
        ..Default::default()
    }
}

fn int(key: &str, value: i64) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(AnyValue { value: Some(Value::IntValue(value)) }),
        ..Default::default()
    }
}

/// A JSON value as an OTLP value: objects become maps, numbers ints where they are.
fn any(json: &serde_json::Value) -> AnyValue {
    use serde_json::Value as J;
    let value = match json {
        J::Null => None,
        J::Bool(b) => Some(Value::BoolValue(*b)),
        J::Number(n) => match n.as_i64() {
            Some(i) => Some(Value::IntValue(i)),
            None => n.as_f64().map(Value::DoubleValue),
        },
        J::String(s) => Some(Value::StringValue(s.clone())),
        J::Array(items) => Some(Value::ArrayValue(ArrayValue { values: items.iter().map(any).collect() })),
        J::Object(map) => Some(Value::KvlistValue(KeyValueList {
            values: map
                .iter()
                .map(|(k, v)| KeyValue { key: k.clone(), value: Some(any(v)), ..Default::default() })
                .collect(),
        })),
    };
    AnyValue { value }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::incidents::{signatures::tests as ev, tests::incident};

    fn attributes(resource: &ResourceLogs) -> BTreeMap<String, String> {
        let attributes = resource.resource.as_ref().map(|r| r.attributes.clone()).unwrap_or_default();
        attributes
            .into_iter()
            .filter_map(|a| match a.value?.value? {
                Value::StringValue(s) => Some((a.key, s)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn each_pods_records_go_under_its_own_resource_the_nodes_under_the_nodes() {
        let (web, api) = (ev::pod("uid-1", "web-1"), ev::pod("uid-2", "api-0"));
        let mut batch = Batch::default();
        let mut seq = 0;
        let mut push = |body: Body| {
            seq += 1;
            batch.push(&Record { seq, time_unix_ns: 5, body }, 9);
        };
        push(Body::Event { event: Arc::new(ev::redirected_reset(1, 2049, &web)) });
        push(Body::Event { event: Arc::new(ev::redirected_reset(2, 2049, &api)) });
        push(Body::Event { event: Arc::new(ev::redirected_reset(3, 2049, &web)) });
        let mut node_wide = incident(None);
        (node_wide.namespace, node_wide.pod, node_wide.pod_uid) = (String::new(), String::new(), None);
        push(Body::Incident { transition: Transition::Fired, incident: Box::new(node_wide) });
        assert_eq!((batch.len(), batch.counts()), (4, [("event", 3), ("incident", 1)]));
        let extra = [("k8s.cluster.name".to_string(), "eu-1".to_string())];
        let request = batch.into_request("node-a", "kstall", &extra);
        assert_eq!(request.resource_logs.len(), 3, "the node's, api-0's, web-1's");
        let by_pod: BTreeMap<String, &ResourceLogs> = request
            .resource_logs
            .iter()
            .map(|r| (attributes(r).get("k8s.pod.name").cloned().unwrap_or_default(), r))
            .collect();
        let web_logs = by_pod["web-1"];
        let web_attributes = attributes(web_logs);
        for (key, value) in [
            ("service.name", "kstall"),
            ("k8s.node.name", "node-a"),
            ("k8s.pod.uid", "uid-1"),
            ("k8s.cluster.name", "eu-1"),
        ] {
            assert_eq!(web_attributes.get(key).map(String::as_str), Some(value), "{key}: {web_attributes:?}");
        }
        assert!(web_attributes.contains_key("k8s.namespace.name"));
        let records = &web_logs.scope_logs[0].log_records;
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].event_name, "kstall.tcp_reset");
        assert_eq!((records[0].time_unix_nano, records[0].observed_time_unix_nano), (5, 9));
        let node = attributes(by_pod[""]);
        assert!(!node.contains_key("k8s.namespace.name") && node.contains_key("k8s.node.name"), "{node:?}");
        let fired = &by_pod[""].scope_logs[0].log_records[0];
        assert_eq!(fired.event_name, "kstall.incident.fired");
        assert!(fired.severity_number >= SeverityNumber::Warn as i32, "{}", fired.severity_text);
        let Some(Value::KvlistValue(body)) = fired.body.as_ref().and_then(|b| b.value.clone()) else {
            panic!("the record as a map: {:?}", fired.body)
        };
        assert!(body.values.iter().any(|kv| kv.key == "incident"), "{body:?}");
        assert!(!fired.attributes.iter().any(|a| a.key == "kstall.capture.path"), "no capture, no path");
    }

    #[test]
    fn an_incident_with_a_capture_names_its_bundle_in_an_attribute() {
        let mut captured = incident(None);
        let path = "/var/lib/kstall/captures/20261207T031500Z-shop-web-1-1a2b.tar.gz";
        captured.evidence =
            serde_json::json!({"capture": {"id": "20261207T031500Z-shop-web-1-1a2b", "path": path}});
        let mut batch = Batch::default();
        let body = Body::Incident { transition: Transition::Fired, incident: Box::new(captured) };
        batch.push(&Record { seq: 1, time_unix_ns: 5, body }, 9);
        let request = batch.into_request("node-a", "kstall", &[]);
        let record = &request.resource_logs[0].scope_logs[0].log_records[0];
        let attribute = record.attributes.iter().find(|a| a.key == "kstall.capture.path").expect("the path");
        assert_eq!(
            attribute.value.as_ref().and_then(|v| v.value.clone()),
            Some(Value::StringValue(path.into()))
        );
    }
}
