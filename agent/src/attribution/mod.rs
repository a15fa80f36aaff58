//! Who an event is about: the pod, container and QoS class behind a cgroup, or the host unit.
//! (Pod metadata, the netns path for softirq events and retention come in later steps.)

pub mod cgroup;
