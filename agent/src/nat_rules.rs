//! What a network namespace's iptables NAT rules do to one TCP connection the kernel's NFS client
//! opens from it: redirected (to which port, by which rule), let through by a rule that skips a
//! redirect (an exclusion), not touched, or — for a match or target kstall does not evaluate —
//! "cannot tell", naming the rule, never a guess. Pure: the text of `iptables-save` (nat, and
//! mangle for the marks nat matches on) in, a [`Verdict`] out.
//!
//! The walk is the kernel's for the first packet of a locally made connection: mangle OUTPUT (it
//! runs before nat and may set the packet's mark), then nat OUTPUT — rules in order, a jump to a
//! user chain and back, RETURN, `-g`, the chain's policy at the end, REDIRECT and DNAT terminal.
//! What the connection is, and why:
//! - TCP, from the pod's address (`-s`), to the server (`-d`, or any address when the server is
//!   not known: then only loopback and link-local ranges are known not to hold it), to one port;
//!   it leaves by the pod's interface, not `lo`, and its destination is no local address;
//! - made by the kernel: the NFS client's transport socket is a kernel socket with no file, so
//!   xt_owner's `--uid-owner`/`--gid-owner` never match it and their negations always do
//!   (net/netfilter/xt_owner.c) — whatever uid the app runs as; its packets carry mark 0 and its
//!   connection mark 0 unless mangle sets them;
//! - new: `--ctstate NEW` and `--syn` match, a fragment does not.

use std::{collections::HashMap, net::IpAddr};

use serde::{Deserialize, Serialize};

/// A rule, as `iptables -t <table> -L <chain> --line-numbers` numbers it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRef {
    pub table: String,
    pub chain: String,
    /// 1-based, in chain order.
    pub number: usize,
    /// The rule as the dump spells it (`-A ISTIO_OUTPUT -p tcp -m tcp --dport 2049 -j RETURN`).
    pub text: String,
}

/// What the NAT rules do to the connection.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "kebab-case")]
pub enum Verdict {
    /// REDIRECT (to a local port) or DNAT (to another address).
    Redirected {
        /// The local port a REDIRECT sends it to (the connection's own when the rule names none);
        /// `None` for a DNAT.
        #[serde(skip_serializing_if = "Option::is_none")]
        to_port: Option<u16>,
        /// A DNAT's `--to-destination`.
        #[serde(skip_serializing_if = "Option::is_none")]
        to_destination: Option<String>,
        /// The rule that rewrote it.
        rule: RuleRef,
        /// The jumps that led there, from nat OUTPUT.
        via: Vec<RuleRef>,
    },
    /// A RETURN or ACCEPT let it past a redirect it would otherwise have reached.
    Excluded { rule: RuleRef },
    /// No rule rewrites it.
    NotTouched,
    /// A rule kstall cannot evaluate decides it.
    CannotTell {
        #[serde(skip_serializing_if = "Option::is_none")]
        rule: Option<RuleRef>,
        why: String,
    },
}

impl Verdict {
    pub fn redirected(&self) -> bool {
        matches!(self, Verdict::Redirected { .. })
    }
}

/// The connection asked about.
#[derive(Debug, Clone, Default)]
pub struct Connection {
    /// The server's address; `None`: any address (only loopback and link-local are known not to
    /// be it).
    pub server: Option<IpAddr>,
    pub port: u16,
    /// The pod's own addresses (the connection's source is one of them); may be empty.
    pub pod_ips: Vec<IpAddr>,
}

/// One `iptables-save` dump: its tables by name.
#[derive(Debug, Clone, Default)]
pub struct Dump {
    tables: HashMap<String, Table>,
}

#[derive(Debug, Clone, Default)]
struct Table {
    name: String,
    chains: HashMap<String, Chain>,
}

#[derive(Debug, Clone, Default)]
struct Chain {
    /// A built-in chain's policy (`ACCEPT`); `None` for a user chain.
    policy: Option<String>,
    rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
struct Rule {
    text: String,
    conditions: Vec<Condition>,
    target: Target,
}

#[derive(Debug, Clone)]
enum Condition {
    Protocol {
        not: bool,
        name: String,
    },
    Destination {
        not: bool,
        net: Net,
    },
    Source {
        not: bool,
        net: Net,
    },
    OutInterface {
        not: bool,
        name: String,
    },
    InInterface {
        name: String,
    },
    Fragment {
        not: bool,
    },
    DestinationPort {
        not: bool,
        ports: Vec<(u16, u16)>,
    },
    SourcePort,
    /// multiport `--ports`: source or destination.
    EitherPort {
        not: bool,
        ports: Vec<(u16, u16)>,
    },
    Mark {
        not: bool,
        value: u32,
        mask: u32,
    },
    ConnMark {
        not: bool,
        value: u32,
        mask: u32,
    },
    Owner {
        not: bool,
    },
    SocketExists {
        not: bool,
    },
    DestinationType {
        not: bool,
        types: Vec<String>,
    },
    SourceType {
        not: bool,
        types: Vec<String>,
    },
    ConnState {
        not: bool,
        states: Vec<String>,
    },
    Syn {
        not: bool,
    },
    /// What kstall does not evaluate, as the rule spells it.
    Unknown(String),
}

/// `-j NAME` (a user chain, or a target with its options: `--to-ports 15001`) or `-g CHAIN`.
#[derive(Debug, Clone, PartialEq)]
struct Target {
    /// Empty: no `-j`, a counter only.
    name: String,
    options: Vec<(String, Vec<String>)>,
    goto: bool,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Net {
    address: IpAddr,
    prefix: u8,
}

impl Net {
    fn parse(text: &str) -> Option<Net> {
        let (address, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let address: IpAddr = address.parse().ok()?;
        let max = if address.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => match p.parse::<u8>() {
                Ok(n) if n <= max => n,
                // The dotted mask form (`/255.0.0.0`).
                _ => {
                    let mask: IpAddr = p.parse().ok()?;
                    let bits = match mask {
                        IpAddr::V4(m) => u32::from(m).leading_ones() as u8,
                        IpAddr::V6(m) => u128::from(m).leading_ones() as u8,
                    };
                    bits.min(max)
                }
            },
        };
        Some(Net { address, prefix })
    }

    fn contains(&self, ip: IpAddr) -> bool {
        match (self.address, ip) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(self.prefix)).unwrap_or(0);
                u32::from(net) & mask == u32::from(ip) & mask
            }
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(self.prefix)).unwrap_or(0);
                u128::from(net) & mask == u128::from(ip) & mask
            }
            _ => false,
        }
    }

    fn within(&self, outer: &str) -> bool {
        let outer = Net::parse(outer).expect("a network");
        self.prefix >= outer.prefix && outer.contains(self.address)
    }

    /// Holds no address a remote NFS server can have: loopback, link-local.
    fn never_a_server(&self) -> bool {
        ["127.0.0.0/8", "169.254.0.0/16", "::1/128", "fe80::/10"].iter().any(|n| self.within(n))
    }

    fn everything(&self) -> bool {
        self.prefix == 0
    }
}

/// Jumps (and gotos) a walk follows before it gives up: iptables itself refuses loops.
const MAX_DEPTH: usize = 64;

/// A verdict reached before the walk's end (boxed: it is large beside what the walk returns).
type Stop = Box<Verdict>;

enum Tri {
    Yes,
    No,
    Unknown(String),
}

fn flip(not: bool, yes: bool) -> Tri {
    if yes != not { Tri::Yes } else { Tri::No }
}

/// The packet's and its connection's marks as the walk reaches nat.
#[derive(Debug, Clone, Copy, Default)]
struct Marks {
    mark: u32,
    ctmark: u32,
}

impl Dump {
    /// Reads `iptables-save` output (also the restore syntax `-N`, `-I`, `-P` Istio's golden
    /// files use). Lines outside a `*table` … `COMMIT` section are ignored.
    pub fn parse(text: &str) -> Dump {
        let mut dump = Dump::default();
        let mut current: Option<String> = None;
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('*') {
                let name = name.trim().to_string();
                dump.tables
                    .entry(name.clone())
                    .or_insert_with(|| Table { name: name.clone(), ..Default::default() });
                current = Some(name);
                continue;
            }
            if line == "COMMIT" {
                current = None;
                continue;
            }
            let Some(table) = current.as_ref().and_then(|t| dump.tables.get_mut(t)) else { continue };
            table.line(line);
        }
        dump
    }

    /// Whether the nat table holds any rule (an empty dump, or only policies, holds none).
    pub fn has_nat_rules(&self) -> bool {
        self.tables.get("nat").is_some_and(|t| t.chains.values().any(|c| !c.rules.is_empty()))
    }

    /// What nat OUTPUT does to `connection`, after mangle OUTPUT has set its marks.
    pub fn verdict(&self, connection: &Connection) -> Verdict {
        let marks = match self.tables.get("mangle") {
            Some(mangle) => match mangle.marks(connection) {
                Ok(marks) => marks,
                Err(verdict) => return *verdict,
            },
            None => Marks::default(),
        };
        match self.tables.get("nat") {
            Some(nat) => nat.walk(connection, marks),
            None => Verdict::NotTouched,
        }
    }
}

impl Table {
    fn chain(&mut self, name: &str) -> &mut Chain {
        self.chains.entry(name.to_string()).or_default()
    }

    fn line(&mut self, line: &str) {
        // `[packets:bytes]` before a rule (`iptables-save -c`).
        let line = match line.strip_prefix('[').and_then(|l| l.split_once(']')) {
            Some((_, rest)) => rest.trim(),
            None => line,
        };
        let words = split_words(line);
        let Some(command) = words.first() else { return };
        match command.as_str() {
            _ if command.starts_with(':') => {
                let name = &command[1..];
                let policy = words.get(1).filter(|p| *p != "-").cloned();
                self.chain(name).policy = policy;
            }
            "-N" | "--new-chain" => {
                if let Some(name) = words.get(1) {
                    self.chain(name);
                }
            }
            "-P" | "--policy" => {
                if let (Some(name), Some(policy)) = (words.get(1), words.get(2)) {
                    self.chain(name).policy = Some(policy.clone());
                }
            }
            "-A" | "--append" | "-I" | "--insert" => {
                let Some(chain) = words.get(1).cloned() else { return };
                let mut rest = &words[2..];
                let mut at = None;
                if matches!(command.as_str(), "-I" | "--insert") {
                    at = Some(0);
                    if let Some(n) = rest.first().and_then(|n| n.parse::<usize>().ok()) {
                        at = Some(n.saturating_sub(1));
                        rest = &rest[1..];
                    }
                }
                // As the dump spells it (quotes kept), an insertion as the append it amounts to.
                let text = match at {
                    None => line.to_string(),
                    Some(_) => format!("-A {chain} {}", rest.join(" ")).trim_end().to_string(),
                };
                let rule = Rule::parse(rest, text);
                let rules = &mut self.chain(&chain).rules;
                match at {
                    Some(i) => rules.insert(i.min(rules.len()), rule),
                    None => rules.push(rule),
                }
            }
            _ => {}
        }
    }

    fn rule_ref(&self, chain: &str, index: usize) -> RuleRef {
        RuleRef {
            table: self.name.clone(),
            chain: chain.to_string(),
            number: index + 1,
            text: self.chains[chain].rules[index].text.clone(),
        }
    }

    fn is_chain(&self, name: &str) -> bool {
        self.chains.get(name).is_some_and(|c| c.policy.is_none())
    }

    /// For each chain and index: whether a rule from there on (or a chain it jumps to) rewrites
    /// connections — what tells an exclusion (a RETURN or ACCEPT that skips a redirect) from a
    /// rule that skips nothing. Computed once a walk, each chain once.
    fn rewrites(&self) -> HashMap<&str, Vec<bool>> {
        type Memo<'a> = HashMap<&'a str, bool>;
        fn chain<'a>(table: &'a Table, name: &'a str, memo: &mut Memo<'a>, depth: usize) -> bool {
            if let Some(&known) = memo.get(name) {
                return known;
            }
            // Deeper than a walk may go (it stops there): not looked into.
            if depth > MAX_DEPTH {
                return false;
            }
            // A loop, which iptables refuses, rewrites nothing by itself.
            memo.insert(name, false);
            let rules = table.chains.get(name).map(|c| c.rules.as_slice()).unwrap_or_default();
            let rewrites = rules.iter().any(|r| rule(table, r, memo, depth));
            memo.insert(name, rewrites);
            rewrites
        }
        fn rule<'a>(table: &'a Table, rule: &'a Rule, memo: &mut Memo<'a>, depth: usize) -> bool {
            let to = rule.target.name.as_str();
            match table.is_chain(to) {
                true => chain(table, to, memo, depth + 1),
                false => matches!(to, "REDIRECT" | "DNAT" | "NETMAP"),
            }
        }
        let mut memo = Memo::new();
        let mut out = HashMap::new();
        for (name, c) in &self.chains {
            let mut from = vec![false; c.rules.len() + 1];
            for (i, r) in c.rules.iter().enumerate().rev() {
                from[i] = rule(self, r, &mut memo, 0) || from[i + 1];
            }
            out.insert(name.as_str(), from);
        }
        out
    }

    /// The marks the packet leaves mangle OUTPUT with.
    fn marks(&self, connection: &Connection) -> Result<Marks, Stop> {
        let mut marks = Marks::default();
        let mut walk = Walk::new(self, "OUTPUT");
        while let Some((chain, index)) = walk.next_rule()? {
            let rule = &self.chains[&chain].rules[index];
            match rule.matches(connection, marks) {
                Tri::No => continue,
                Tri::Unknown(why) => {
                    return Err(Box::new(Verdict::CannotTell {
                        rule: Some(self.rule_ref(&chain, index)),
                        why,
                    }));
                }
                Tri::Yes => {}
            }
            let Target { name, options, goto } = &rule.target;
            if self.is_chain(name) {
                walk.enter(name, *goto, self.rule_ref(&chain, index))?;
                continue;
            }
            match name.as_str() {
                "" => {}
                "RETURN" => walk.leave(),
                "ACCEPT" => return Ok(marks),
                "MARK" => {
                    marks.mark = set_mark(marks.mark, options).ok_or_else(|| {
                        Box::new(cannot(self, &chain, index, "a MARK kstall cannot read".into()))
                    })?
                }
                "CONNMARK" => {
                    marks = connmark(marks, options).ok_or_else(|| {
                        Box::new(cannot(self, &chain, index, "a CONNMARK kstall cannot read".into()))
                    })?
                }
                // Targets that change nothing nat looks at.
                "LOG" | "NFLOG" | "TRACE" | "AUDIT" | "CT" | "TOS" | "DSCP" | "TCPMSS" | "CLASSIFY"
                | "CHECKSUM" | "TTL" | "HL" | "ECN" | "SECMARK" | "CONNSECMARK" | "TEE" => {}
                other => {
                    return Err(Box::new(cannot(self, &chain, index, format!("mangle's target {other}"))));
                }
            }
        }
        Ok(marks)
    }

    /// nat OUTPUT, as the kernel walks it for the connection's first packet.
    fn walk(&self, connection: &Connection, mut marks: Marks) -> Verdict {
        let mut walk = Walk::new(self, "OUTPUT");
        let rewrites = self.rewrites();
        let rewrites_from = |chain: &str, index: usize| {
            rewrites.get(chain).and_then(|r| r.get(index)).copied().unwrap_or(false)
        };
        // A RETURN that skipped a redirect, while the walk has not met another since.
        let mut excluded: Option<RuleRef> = None;
        loop {
            let (chain, index) = match walk.next_rule() {
                Ok(Some(at)) => at,
                Ok(None) => break,
                Err(verdict) => return *verdict,
            };
            let rule = &self.chains[&chain].rules[index];
            match rule.matches(connection, marks) {
                Tri::No => continue,
                Tri::Unknown(why) => {
                    return Verdict::CannotTell { rule: Some(self.rule_ref(&chain, index)), why };
                }
                Tri::Yes => {}
            }
            let here = self.rule_ref(&chain, index);
            let Target { name, options, goto } = &rule.target;
            if self.is_chain(name) {
                if let Err(verdict) = walk.enter(name, *goto, here) {
                    return *verdict;
                }
                continue;
            }
            match name.as_str() {
                "" => {}
                "RETURN" => {
                    if rewrites_from(&chain, index + 1) {
                        excluded.get_or_insert(here);
                    }
                    walk.leave();
                }
                "ACCEPT" => {
                    let skipped =
                        rewrites_from(&chain, index + 1) || walk.callers().any(|(c, i)| rewrites_from(c, i));
                    return match (skipped, excluded) {
                        (true, _) => Verdict::Excluded { rule: here },
                        (false, Some(rule)) => Verdict::Excluded { rule },
                        (false, None) => Verdict::NotTouched,
                    };
                }
                "REDIRECT" => {
                    let to_port = match option(options, "--to-ports") {
                        None => Some(connection.port),
                        Some(ports) => ports.split(['-', ':']).next().and_then(|p| p.parse().ok()),
                    };
                    if to_port.is_none() {
                        return cannot(self, &chain, index, "a REDIRECT port kstall cannot read".into());
                    }
                    return Verdict::Redirected {
                        to_port,
                        to_destination: None,
                        rule: here,
                        via: walk.via.clone(),
                    };
                }
                "DNAT" | "NETMAP" => {
                    let to = option(options, "--to-destination").or_else(|| option(options, "--to"));
                    return Verdict::Redirected {
                        to_port: None,
                        to_destination: Some(to.unwrap_or_default().to_string()),
                        rule: here,
                        via: walk.via.clone(),
                    };
                }
                "MARK" => match set_mark(marks.mark, options) {
                    Some(mark) => marks.mark = mark,
                    None => return cannot(self, &chain, index, "a MARK kstall cannot read".into()),
                },
                "CONNMARK" => match connmark(marks, options) {
                    Some(m) => marks = m,
                    None => return cannot(self, &chain, index, "a CONNMARK kstall cannot read".into()),
                },
                "LOG" | "NFLOG" | "TRACE" | "AUDIT" => {}
                other => return cannot(self, &chain, index, format!("the target {other}")),
            }
        }
        match excluded {
            Some(rule) => Verdict::Excluded { rule },
            None => Verdict::NotTouched,
        }
    }
}

fn cannot(table: &Table, chain: &str, index: usize, what: String) -> Verdict {
    Verdict::CannotTell {
        rule: Some(table.rule_ref(chain, index)),
        why: format!("kstall does not evaluate {what}"),
    }
}

/// A target's option value (`--to-ports` also as `--to-port`, which iptables accepts).
fn option<'a>(options: &'a [(String, Vec<String>)], name: &str) -> Option<&'a str> {
    options
        .iter()
        .find(|(o, _)| o == name || (name.starts_with(o.as_str()) && o.len() > 4))
        .and_then(|(_, v)| v.first().map(String::as_str))
}

/// `value[/mask]` in hex or decimal.
fn mark_value(text: &str) -> Option<(u32, u32)> {
    let number = |t: &str| match t.strip_prefix("0x") {
        Some(hex) => u32::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    };
    match text.split_once('/') {
        Some((v, m)) => Some((number(v)?, number(m)?)),
        None => Some((number(text)?, u32::MAX)),
    }
}

fn set_mark(mark: u32, options: &[(String, Vec<String>)]) -> Option<u32> {
    let (name, values) = options.first()?;
    let (value, mask) = mark_value(values.first()?)?;
    Some(match name.as_str() {
        "--set-xmark" => (mark & !mask) ^ value,
        "--set-mark" => (mark & !mask) | value,
        "--and-mark" => mark & value,
        "--or-mark" => mark | value,
        "--xor-mark" => mark ^ value,
        _ => return None,
    })
}

fn connmark(marks: Marks, options: &[(String, Vec<String>)]) -> Option<Marks> {
    let value = |name: &str| options.iter().find(|(o, _)| o == name).and_then(|(_, v)| v.first());
    let masks = |name: &str| value(name).and_then(|m| mark_value(m)).map(|(m, _)| m).unwrap_or(u32::MAX);
    let mut out = marks;
    if let Some(v) = value("--set-xmark").or_else(|| value("--set-mark")) {
        let (v, m) = mark_value(v)?;
        out.ctmark = (marks.ctmark & !m) ^ v;
    } else if options.iter().any(|(o, _)| o == "--restore-mark") {
        let (nf, ct) = (masks("--nfmask"), masks("--ctmask"));
        let mask = value("--mask").and_then(|m| mark_value(m)).map(|(m, _)| m);
        let (nf, ct) = mask.map_or((nf, ct), |m| (m, m));
        out.mark = (marks.mark & !nf) ^ (marks.ctmark & ct);
    } else if options.iter().any(|(o, _)| o == "--save-mark") {
        let (nf, ct) = (masks("--nfmask"), masks("--ctmask"));
        let mask = value("--mask").and_then(|m| mark_value(m)).map(|(m, _)| m);
        let (nf, ct) = mask.map_or((nf, ct), |m| (m, m));
        out.ctmark = (marks.ctmark & !ct) ^ (marks.mark & nf);
    } else {
        return None;
    }
    Some(out)
}

/// Where the walk is: the chain and the next rule's index, and the callers to go back to.
struct Walk<'a> {
    table: &'a Table,
    chain: String,
    next: usize,
    stack: Vec<(String, usize)>,
    via: Vec<RuleRef>,
    steps: usize,
}

impl<'a> Walk<'a> {
    fn new(table: &'a Table, chain: &str) -> Self {
        Walk { table, chain: chain.to_string(), next: 0, stack: Vec::new(), via: Vec::new(), steps: 0 }
    }

    /// The next rule to test, `None` at the end of the built-in chain (its policy applies).
    fn next_rule(&mut self) -> Result<Option<(String, usize)>, Stop> {
        loop {
            self.steps += 1;
            if self.steps > 100_000 {
                return Err(Box::new(Verdict::CannotTell { rule: None, why: "the rules loop".into() }));
            }
            let Some(chain) = self.table.chains.get(&self.chain) else {
                return Ok(None);
            };
            if self.next < chain.rules.len() {
                self.next += 1;
                return Ok(Some((self.chain.clone(), self.next - 1)));
            }
            if self.stack.is_empty() {
                return match chain.policy.as_deref() {
                    None | Some("ACCEPT") => Ok(None),
                    Some(policy) => Err(Box::new(Verdict::CannotTell {
                        rule: None,
                        why: format!("{} {}'s policy is {policy}", self.table.name, self.chain),
                    })),
                };
            }
            self.leave();
        }
    }

    fn enter(&mut self, chain: &str, goto: bool, by: RuleRef) -> Result<(), Stop> {
        if self.via.len() >= MAX_DEPTH {
            return Err(Box::new(Verdict::CannotTell { rule: Some(by), why: "jumps nest too deep".into() }));
        }
        if !goto {
            self.stack.push((self.chain.clone(), self.next));
        }
        self.via.push(by);
        self.chain = chain.to_string();
        self.next = 0;
        Ok(())
    }

    /// RETURN, or the end of a user chain: back to the caller, or to the policy.
    fn leave(&mut self) {
        match self.stack.pop() {
            Some((chain, next)) => {
                // The jumps taken into the chain left are no longer the way.
                while self.via.last().is_some_and(|r| r.chain != chain) {
                    self.via.pop();
                }
                self.via.pop();
                self.chain = chain;
                self.next = next;
            }
            None => self.next = usize::MAX / 2,
        }
    }

    /// The callers' chains and where each resumes.
    fn callers(&self) -> impl Iterator<Item = (&str, usize)> {
        self.stack.iter().map(|(c, i)| (c.as_str(), *i))
    }
}

impl Rule {
    fn parse(words: &[String], text: String) -> Rule {
        let mut conditions = Vec::new();
        let mut target = Target { name: String::new(), options: Vec::new(), goto: false };
        let mut in_target = false;
        let mut module: Option<String> = None;
        let mut not = false;
        let mut i = 0;
        let value = |i: usize| words.get(i + 1).cloned().unwrap_or_default();
        while i < words.len() {
            let word = words[i].as_str();
            let mut step = 2;
            match word {
                "!" => {
                    not = true;
                    i += 1;
                    continue;
                }
                "-p" | "--protocol" => {
                    conditions.push(Condition::Protocol { not, name: value(i).to_ascii_lowercase() })
                }
                "-s" | "--source" | "--src" | "-d" | "--destination" | "--dst" => {
                    let text = value(i);
                    conditions.push(match Net::parse(&text) {
                        Some(net) if word.starts_with("-s") || word == "--src" => {
                            Condition::Source { not, net }
                        }
                        Some(net) => Condition::Destination { not, net },
                        None => Condition::Unknown(format!("{word} {text}")),
                    });
                }
                "-o" | "--out-interface" => conditions.push(Condition::OutInterface { not, name: value(i) }),
                "-i" | "--in-interface" => conditions.push(Condition::InInterface { name: value(i) }),
                "-f" | "--fragment" => {
                    conditions.push(Condition::Fragment { not });
                    step = 1;
                }
                "-m" | "--match" => {
                    let name = value(i);
                    if !KNOWN_MODULES.contains(&name.as_str()) {
                        conditions.push(Condition::Unknown(format!("-m {name}")));
                    }
                    module = Some(name);
                    in_target = false;
                }
                "-j" | "--jump" | "-g" | "--goto" => {
                    target.name = value(i);
                    target.goto = matches!(word, "-g" | "--goto");
                    in_target = true;
                }
                "-c" | "--set-counters" => step = 3,
                _ if word.starts_with("--") => {
                    let values: Vec<String> = words[i + 1..]
                        .iter()
                        .take_while(|w| !w.starts_with('-') && *w != "!")
                        .cloned()
                        .collect();
                    step = 1 + values.len();
                    if in_target {
                        target.options.push((word.to_string(), values));
                    } else if let Some(condition) = module_option(module.as_deref(), word, &values, not) {
                        conditions.push(condition);
                    }
                }
                other => conditions.push(Condition::Unknown(other.to_string())),
            }
            not = false;
            i += step;
        }
        Rule { text, conditions, target }
    }

    fn matches(&self, connection: &Connection, marks: Marks) -> Tri {
        let mut unknown = None;
        for condition in &self.conditions {
            match condition.test(connection, marks) {
                Tri::No => return Tri::No,
                Tri::Unknown(why) => {
                    unknown.get_or_insert(why);
                }
                Tri::Yes => {}
            }
        }
        match unknown {
            Some(why) => Tri::Unknown(why),
            None => Tri::Yes,
        }
    }
}

const KNOWN_MODULES: &[&str] =
    &["tcp", "udp", "multiport", "mark", "connmark", "owner", "addrtype", "comment", "conntrack"];

/// `--option values` of the module in force (`-p tcp` brings `--dport` without `-m tcp`).
fn module_option(module: Option<&str>, option: &str, values: &[String], not: bool) -> Option<Condition> {
    let first = values.first().map(String::as_str).unwrap_or_default();
    let spelled =
        || format!("{}{option} {}", if not { "! " } else { "" }, values.join(" ")).trim().to_string();
    let ports = || parse_ports(first);
    let marks = || mark_value(first);
    let list = || first.split(',').map(|s| s.to_ascii_uppercase()).collect::<Vec<_>>();
    Some(match (module.unwrap_or("tcp"), option) {
        (_, "--comment") | ("owner", "--suppl-groups") => return None,
        ("tcp" | "udp", "--dport" | "--destination-port")
        | ("multiport", "--dports" | "--destination-ports") => match ports() {
            Some(ports) => Condition::DestinationPort { not, ports },
            None => Condition::Unknown(spelled()),
        },
        ("tcp" | "udp", "--sport" | "--source-port") | ("multiport", "--sports" | "--source-ports") => {
            Condition::SourcePort
        }
        ("multiport", "--ports") => match ports() {
            Some(ports) => Condition::EitherPort { not, ports },
            None => Condition::Unknown(spelled()),
        },
        ("tcp", "--syn") => Condition::Syn { not },
        ("mark", "--mark") => match marks() {
            Some((value, mask)) => Condition::Mark { not, value, mask },
            None => Condition::Unknown(spelled()),
        },
        ("connmark", "--mark") => match marks() {
            Some((value, mask)) => Condition::ConnMark { not, value, mask },
            None => Condition::Unknown(spelled()),
        },
        ("owner", "--uid-owner" | "--gid-owner") => Condition::Owner { not },
        ("owner", "--socket-exists") => Condition::SocketExists { not },
        ("addrtype", "--dst-type") => Condition::DestinationType { not, types: list() },
        ("addrtype", "--src-type") => Condition::SourceType { not, types: list() },
        ("conntrack", "--ctstate") => Condition::ConnState { not, states: list() },
        (module, _) if KNOWN_MODULES.contains(&module) => Condition::Unknown(spelled()),
        // An unknown module's options: the module itself is already the rule's unknown.
        _ => return None,
    })
}

/// `2049`, `4567,4568`, `1000:2000`.
fn parse_ports(text: &str) -> Option<Vec<(u16, u16)>> {
    text.split(',')
        .map(|part| match part.split_once(':') {
            Some((a, b)) => Some((a.parse().unwrap_or(0), b.parse().unwrap_or(u16::MAX))),
            None => part.parse().ok().map(|p| (p, p)),
        })
        .collect()
}

impl Condition {
    fn test(&self, connection: &Connection, marks: Marks) -> Tri {
        let port = connection.port;
        let in_ranges = |ports: &[(u16, u16)]| ports.iter().any(|(a, b)| (*a..=*b).contains(&port));
        match self {
            Condition::Protocol { not, name } => flip(*not, matches!(name.as_str(), "tcp" | "6" | "all" | "0")),
            Condition::Destination { not, net } => match connection.server {
                Some(server) => flip(*not, net.contains(server)),
                None if net.everything() => flip(*not, true),
                None if net.never_a_server() => flip(*not, false),
                None => Tri::Unknown(format!(
                    "it depends on whether the NFS server is in {}/{}, and kstall knows no NFS mount of the \
                     pod to tell its address",
                    net.address, net.prefix
                )),
            },
            Condition::Source { not, net } => {
                let family = |ip: &&IpAddr| connection.server.is_none_or(|s| s.is_ipv4() == ip.is_ipv4());
                let source = connection.pod_ips.iter().find(family);
                match source {
                    Some(ip) => flip(*not, net.contains(*ip)),
                    None if net.everything() => flip(*not, true),
                    // A connection to a remote server leaves from the pod's address, not loopback.
                    None if net.within("127.0.0.0/8") || net.within("::1/128") => flip(*not, false),
                    None => Tri::Unknown(format!(
                        "it depends on the pod's address (in {}/{}?), which kstall does not know",
                        net.address, net.prefix
                    )),
                }
            }
            Condition::OutInterface { not, name } => match name.as_str() {
                "lo" => flip(*not, false),
                "+" => flip(*not, true),
                _ => Tri::Unknown(format!(
                    "it depends on the interface the connection leaves by (-o {name}), which kstall does not know"
                )),
            },
            Condition::InInterface { name } => {
                Tri::Unknown(format!("-i {name} in a chain of locally made connections"))
            }
            Condition::Fragment { not } => flip(*not, false),
            Condition::DestinationPort { not, ports } => flip(*not, in_ranges(ports)),
            Condition::SourcePort => {
                Tri::Unknown("it depends on the source port the NFS client binds, which kstall does not know".into())
            }
            Condition::EitherPort { not, ports } => match in_ranges(ports) {
                true => flip(*not, true),
                false => Tri::Unknown(
                    "it depends on the source port the NFS client binds (multiport --ports), which kstall does \
                     not know"
                        .into(),
                ),
            },
            Condition::Mark { not, value, mask } => flip(*not, marks.mark & mask == *value),
            Condition::ConnMark { not, value, mask } => flip(*not, marks.ctmark & mask == *value),
            // The kernel's socket has no file: xt_owner's uid and gid matches fail on it.
            Condition::Owner { not } => flip(*not, false),
            Condition::SocketExists { not } => flip(*not, true),
            // A remote server's address is a unicast one; the pod's own is local.
            Condition::DestinationType { not, types } => flip(*not, types.iter().any(|t| t == "UNICAST")),
            Condition::SourceType { not, types } => flip(*not, types.iter().any(|t| t == "LOCAL")),
            Condition::ConnState { not, states } => flip(*not, states.iter().any(|s| s == "NEW")),
            Condition::Syn { not } => flip(*not, true),
            Condition::Unknown(what) => Tri::Unknown(format!("kstall does not evaluate `{what}`")),
        }
    }
}

/// A rule line's words, double quotes grouping (`--comment "a b"`), a backslash escaping in them.
fn split_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut quoted = false;
    let mut started = false;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = !quoted;
                started = true;
            }
            '\\' if quoted => {
                if let Some(next) = chars.next() {
                    word.push(next);
                }
            }
            c if c.is_whitespace() && !quoted => {
                if started {
                    words.push(std::mem::take(&mut word));
                    started = false;
                }
            }
            c => {
                word.push(c);
                started = true;
            }
        }
    }
    if started {
        words.push(word);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISTIO_SIDECAR: &str = include_str!("../../tests/data/istio-iptables/kube-virt-interfaces.golden");
    const ISTIO_EXCLUDING: &str =
        include_str!("../../tests/data/istio-iptables/exclude-outbound-ports.iptables-save");
    const ISTIO_EXCLUSION_RULES: &str =
        include_str!("../../tests/data/istio-iptables/exclude-outbound-ports.rules");
    const AMBIENT_COMMANDS: &str = include_str!("../../tests/data/istio-iptables/ambient-default.golden");
    const AMBIENT_SAVED: &str = include_str!("../../tests/data/istio-iptables/ambient-default.iptables-save");
    const LINKERD_COMMANDS: &str = include_str!("../../tests/data/linkerd-proxy-init/outbound.rules");
    const LINKERD_SKIPPING: &str =
        include_str!("../../tests/data/linkerd-proxy-init/skip-outbound-ports.iptables-save");
    const LINKERD_SKIPPING_COMMANDS: &str =
        include_str!("../../tests/data/linkerd-proxy-init/skip-outbound-ports.rules");
    const NFS_PORTS: [u16; 3] = [2049, 111, 20048];

    /// `iptables -t <table> <rule>` command lines (the meshes' own test data) as a dump.
    fn from_commands(commands: &str) -> String {
        let mut tables: Vec<(String, Vec<String>)> = Vec::new();
        for line in commands.lines() {
            let Some(rest) = line.strip_prefix("iptables -t ") else { continue };
            let (table, rule) = rest.split_once(' ').unwrap();
            match tables.iter_mut().find(|(t, _)| t == table) {
                Some((_, rules)) => rules.push(rule.to_string()),
                None => tables.push((table.to_string(), vec![rule.to_string()])),
            }
        }
        tables.iter().map(|(t, rules)| format!("*{t}\n{}\nCOMMIT\n", rules.join("\n"))).collect()
    }

    fn to(server: Option<&str>, port: u16) -> Connection {
        Connection { server: server.map(|s| s.parse().unwrap()), port, pod_ips: vec![] }
    }

    fn verdicts(dump: &str, server: Option<&str>) -> Vec<Verdict> {
        let dump = Dump::parse(dump);
        NFS_PORTS.iter().map(|&port| dump.verdict(&to(server, port))).collect()
    }

    /// (port it goes to, the rewriting rule's chain and number, the jumps as `CHAIN n`).
    fn redirect(verdict: &Verdict) -> (Option<u16>, String, usize, Vec<String>) {
        let Verdict::Redirected { to_port, rule, via, .. } = verdict else {
            panic!("not redirected: {verdict:?}")
        };
        let via = via.iter().map(|r| format!("{} {}", r.chain, r.number)).collect();
        (*to_port, rule.chain.clone(), rule.number, via)
    }

    fn excluded_by(verdict: &Verdict) -> &RuleRef {
        let Verdict::Excluded { rule } = verdict else { panic!("not excluded: {verdict:?}") };
        rule
    }

    #[test]
    fn istios_classic_sidecar_redirects_every_nfs_port_to_envoy() {
        for server in [None, Some("10.55.0.1"), Some("fd00::5")] {
            for verdict in verdicts(ISTIO_SIDECAR, server) {
                let (port, chain, number, via) = redirect(&verdict);
                assert_eq!((port, chain.as_str(), number), (Some(15001), "ISTIO_REDIRECT", 1), "{server:?}");
                assert_eq!(via, ["OUTPUT 1", "ISTIO_OUTPUT 9"], "{server:?}");
            }
        }
        // Past its own exemptions (the proxy's uid and gid, loopback) to the catch-all jump.
        let Verdict::Redirected { via, .. } = &verdicts(ISTIO_SIDECAR, None)[0] else { unreachable!() };
        assert_eq!(via[1].text, "-A ISTIO_OUTPUT -j ISTIO_REDIRECT");
    }

    #[test]
    fn istios_exclude_outbound_ports_rules_let_nfs_through_and_nothing_else() {
        for server in [None, Some("10.55.0.1")] {
            let verdicts = verdicts(ISTIO_EXCLUDING, server);
            let rules: Vec<&str> = verdicts.iter().map(|v| excluded_by(v).text.as_str()).collect();
            assert_eq!(
                rules,
                [
                    "-A ISTIO_OUTPUT -p tcp -m tcp --dport 2049 -j RETURN",
                    "-A ISTIO_OUTPUT -p tcp -m tcp --dport 111 -j RETURN",
                    "-A ISTIO_OUTPUT -p tcp -m tcp --dport 20048 -j RETURN",
                ]
            );
            let numbers: Vec<usize> = verdicts.iter().map(|v| excluded_by(v).number).collect();
            assert_eq!(numbers, [3, 1, 5], "the tcp rules, not the udp ones");
        }
        let other = Dump::parse(ISTIO_EXCLUDING).verdict(&to(None, 3049));
        assert_eq!(redirect(&other).0, Some(15001), "a port not excluded");
        // The same rules in the golden's restore syntax, placed as istio-iptables appends them.
        let golden: String = ISTIO_SIDECAR
            .lines()
            .flat_map(|l| {
                let after = (l == "-A OUTPUT -j ISTIO_OUTPUT").then_some(ISTIO_EXCLUSION_RULES);
                std::iter::once(format!("{l}\n")).chain(after.map(String::from))
            })
            .collect();
        for verdict in verdicts(&golden, None) {
            assert!(excluded_by(&verdict).text.starts_with("-A ISTIO_OUTPUT -p tcp --dport"), "{verdict:?}");
        }
    }

    #[test]
    fn istio_ambient_redirects_to_ztunnels_in_pod_port_past_its_mark_rules() {
        for dump in [from_commands(AMBIENT_COMMANDS), AMBIENT_SAVED.to_string()] {
            for verdict in verdicts(&dump, None) {
                let (port, chain, number, via) = redirect(&verdict);
                assert_eq!(
                    (port, chain.as_str(), number, via),
                    (Some(15001), "ISTIO_OUTPUT", 5, vec!["OUTPUT 1".into()])
                );
                let Verdict::Redirected { rule, .. } = &verdict else { unreachable!() };
                assert!(rule.text.contains("-m mark ! --mark 0x539/0xfff"), "{rule:?}");
            }
        }
        // ztunnel's own connections carry its mark: a mangle rule marking the app's would exempt it.
        let marked = AMBIENT_SAVED.replacen(
            "-A OUTPUT -j ISTIO_OUTPUT\n",
            "-A OUTPUT -j ISTIO_OUTPUT\n-A OUTPUT -p tcp -m tcp --dport 2049 -j MARK --set-xmark 0x539/0xfff\n",
            1,
        );
        let verdicts = verdicts(&marked, None);
        assert_eq!(verdicts[0], Verdict::NotTouched, "mark 0x539 set in mangle: {:?}", verdicts[0]);
        assert!(verdicts[1].redirected());
    }

    #[test]
    fn linkerd_redirects_to_its_proxy_and_skip_outbound_ports_exempts_nfs() {
        for verdict in verdicts(&from_commands(LINKERD_COMMANDS), None) {
            let (port, chain, number, via) = redirect(&verdict);
            assert_eq!(
                (port, chain.as_str(), number, via),
                (Some(4140), "PROXY_INIT_OUTPUT", 4, vec!["OUTPUT 1".into()])
            );
        }
        // Its default skipped ports are an exclusion too.
        let default = Dump::parse(&from_commands(LINKERD_COMMANDS)).verdict(&to(None, 4568));
        assert_eq!(excluded_by(&default).number, 3);
        for dump in [LINKERD_SKIPPING.to_string(), from_commands(LINKERD_SKIPPING_COMMANDS)] {
            for verdict in verdicts(&dump, Some("10.55.0.1")) {
                let rule = excluded_by(&verdict);
                assert_eq!((rule.chain.as_str(), rule.number), ("PROXY_INIT_OUTPUT", 3));
                assert!(rule.text.contains("--dports 2049,111,20048"), "{rule:?}");
            }
            assert!(Dump::parse(&dump).verdict(&to(None, 3049)).redirected());
        }
        assert!(LINKERD_SKIPPING.contains(r#"--comment "proxy-init/ignore-port-2049,111,20048""#));
    }

    /// Both meshes' rules in one namespace: the first redirect met wins, and one mesh's exclusion
    /// does not exempt the connection from the other's.
    #[test]
    fn two_meshes_the_first_redirect_wins_and_one_exclusion_is_not_enough() {
        let linkerd_nat: Vec<String> = LINKERD_COMMANDS
            .lines()
            .filter_map(|l| l.strip_prefix("iptables -t nat "))
            .map(String::from)
            .collect();
        let both = |istio: &str| istio.replace("COMMIT", &format!("{}\nCOMMIT", linkerd_nat.join("\n")));
        for verdict in verdicts(&both(ISTIO_SIDECAR), None) {
            assert_eq!(redirect(&verdict).0, Some(15001), "Istio's jump comes first");
        }
        for verdict in verdicts(&both(ISTIO_EXCLUDING), None) {
            let (port, chain, _, via) = redirect(&verdict);
            assert_eq!((port, chain.as_str()), (Some(4140), "PROXY_INIT_OUTPUT"));
            assert_eq!(via, ["OUTPUT 2"]);
        }
    }

    #[test]
    fn a_match_kstall_does_not_evaluate_is_cannot_tell_naming_the_rule() {
        let dump = ISTIO_EXCLUDING.replacen(
            "-A OUTPUT -j ISTIO_OUTPUT\n",
            "-A OUTPUT -p tcp -m set --match-set nfs-servers dst -j RETURN\n-A OUTPUT -j ISTIO_OUTPUT\n",
            1,
        );
        for verdict in verdicts(&dump, Some("10.55.0.1")) {
            let Verdict::CannotTell { rule: Some(rule), why } = &verdict else { panic!("{verdict:?}") };
            assert_eq!((rule.chain.as_str(), rule.number), ("OUTPUT", 1));
            assert_eq!(rule.text, "-A OUTPUT -p tcp -m set --match-set nfs-servers dst -j RETURN");
            assert_eq!(why, "kstall does not evaluate `-m set`");
        }
        // A rule that cannot match the connection anyway does not stop the walk.
        let udp_only = dump.replace("-A OUTPUT -p tcp -m set", "-A OUTPUT -p udp -m set");
        assert!(verdicts(&udp_only, None).iter().all(|v| matches!(v, Verdict::Excluded { .. })));
        // An unknown target decides as much.
        let target = ISTIO_SIDECAR.replace("-j REDIRECT --to-ports 15001", "-j TPROXY --on-port 15001");
        let Verdict::CannotTell { why, .. } = &verdicts(&target, None)[0] else { panic!() };
        assert_eq!(why, "kstall does not evaluate the target TPROXY");
    }

    #[test]
    fn address_ranges_decide_by_the_server_and_say_so_when_it_is_unknown() {
        // includeOutboundIPRanges: "10.0.0.0/8" (ipnets.golden's shape).
        let ranges = ISTIO_SIDECAR
            .replace("-A ISTIO_OUTPUT -j ISTIO_REDIRECT", "-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT");
        assert!(verdicts(&ranges, Some("10.55.0.1")).iter().all(Verdict::redirected));
        assert!(verdicts(&ranges, Some("192.168.7.3")).iter().all(|v| *v == Verdict::NotTouched));
        let Verdict::CannotTell { rule: Some(rule), why } = &verdicts(&ranges, None)[0] else { panic!() };
        assert_eq!(rule.text, "-A ISTIO_OUTPUT -d 10.0.0.0/8 -j ISTIO_REDIRECT");
        assert!(why.contains("whether the NFS server is in 10.0.0.0/8"), "{why}");
        // excludeOutboundIPRanges: the server's own address.
        let server_excluded = ISTIO_SIDECAR.replace(
            "-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
            "-A ISTIO_OUTPUT -d 10.55.0.1/32 -j RETURN\n-A ISTIO_OUTPUT -j ISTIO_REDIRECT",
        );
        assert_eq!(excluded_by(&verdicts(&server_excluded, Some("10.55.0.1"))[0]).number, 9);
        assert!(verdicts(&server_excluded, Some("10.55.0.2"))[0].redirected());
    }

    #[test]
    fn ports_marks_address_types_and_gotos_as_the_kernel_matches_them() {
        let dump = "*mangle\n:OUTPUT ACCEPT [0:0]\n-A OUTPUT -p tcp -m multiport --dports 20000:20100 -j MARK --set-mark 0x4/0x4\nCOMMIT\n\
                    *nat\n:OUTPUT ACCEPT [0:0]\n:MESH - [0:0]\n:MESH_REDIRECT - [0:0]\n\
                    -A OUTPUT -m addrtype --dst-type LOCAL -j RETURN\n\
                    -A OUTPUT -m comment --comment \"the mesh's \\\"jump\\\"\" -g MESH\n\
                    -A OUTPUT -p tcp -j REDIRECT --to-ports 1\n\
                    -A MESH -m mark --mark 0x4/0x4 -j RETURN\n\
                    -A MESH -p tcp -m multiport ! --dports 111,2040:2050 -m addrtype ! --dst-type LOCAL -j MESH_REDIRECT\n\
                    -A MESH -m owner ! --uid-owner 0 -j MESH_REDIRECT\n\
                    -A MESH_REDIRECT -p tcp -j REDIRECT\nCOMMIT\n";
        let parsed = Dump::parse(dump);
        // 20048 is marked in mangle: the RETURN of the goto'd chain ends the walk at the policy.
        assert_eq!(excluded_by(&parsed.verdict(&to(None, 20048))).number, 1);
        // 2049 and 111 pass the multiport rule, the negated owner match takes them.
        for port in [2049, 111] {
            let (to_port, chain, _, via) = redirect(&parsed.verdict(&to(None, port)));
            assert_eq!(
                (to_port, chain.as_str(), via),
                (Some(port), "MESH_REDIRECT", vec!["OUTPUT 2".into(), "MESH 3".into()])
            );
        }
        let (_, _, _, via) = redirect(&parsed.verdict(&to(None, 3000)));
        assert_eq!(via, ["OUTPUT 2", "MESH 2"]);
    }

    #[test]
    fn no_rules_touch_nothing() {
        for dump in [
            "",
            "*nat\n:PREROUTING ACCEPT [0:0]\n:OUTPUT ACCEPT [0:0]\nCOMMIT\n",
            "*filter\n-A OUTPUT -j DROP\nCOMMIT\n",
        ] {
            let parsed = Dump::parse(dump);
            assert!(!parsed.has_nat_rules());
            assert_eq!(parsed.verdict(&to(Some("10.55.0.1"), 2049)), Verdict::NotTouched);
        }
        assert!(Dump::parse(ISTIO_SIDECAR).has_nat_rules());
    }

    /// Rules iptables would refuse (loops) or that nest past a walk's depth end in "cannot tell",
    /// and a large dump is walked in one pass.
    #[test]
    fn loops_deep_nesting_and_large_dumps_end() {
        let looped = "*nat\n-A OUTPUT -j A\n-A A -j B\n-A B -j A\nCOMMIT\n";
        let gone_round = "*nat\n-A OUTPUT -g A\n-A A -g B\n-A B -g A\nCOMMIT\n";
        for dump in [looped, gone_round] {
            let Verdict::CannotTell { why, .. } = Dump::parse(dump).verdict(&to(None, 2049)) else {
                panic!("{dump}")
            };
            assert_eq!(why, "jumps nest too deep");
        }
        let deep: String = (0..5000).map(|i| format!("-A C{i} -j C{}\n", i + 1)).collect();
        let deep = format!("*nat\n-A OUTPUT -j C0\n{deep}-A C5000 -j REDIRECT --to-ports 1\nCOMMIT\n");
        assert!(matches!(Dump::parse(&deep).verdict(&to(None, 2049)), Verdict::CannotTell { .. }));
        let many: String =
            (0..20_000).map(|i| format!("-A M -p tcp --dport {} -j RETURN\n", 30_000 + i)).collect();
        let many = format!("*nat\n-A OUTPUT -j M\n{many}-A M -p tcp -j REDIRECT --to-ports 1\nCOMMIT\n");
        let started = std::time::Instant::now();
        let parsed = Dump::parse(&many);
        assert_eq!(excluded_by(&parsed.verdict(&to(None, 30_007))).number, 8);
        assert!(parsed.verdict(&to(None, 2049)).redirected());
        assert!(started.elapsed() < std::time::Duration::from_secs(5), "{:?}", started.elapsed());
    }

    #[test]
    fn words_and_networks() {
        assert_eq!(
            split_words(r#"-m comment --comment "a \"b\" c" -j X"#),
            ["-m", "comment", "--comment", "a \"b\" c", "-j", "X"]
        );
        let net = Net::parse("10.0.0.0/255.0.0.0").unwrap();
        assert_eq!(net.prefix, 8);
        assert!(net.contains("10.9.9.9".parse().unwrap()) && !net.contains("11.0.0.1".parse().unwrap()));
        assert!(Net::parse("127.0.0.1").unwrap().never_a_server());
        assert!(Net::parse("169.254.7.127/32").unwrap().never_a_server());
        assert!(!Net::parse("10.55.0.1/32").unwrap().never_a_server());
        assert!(Net::parse("::/0").unwrap().contains("fd00::1".parse().unwrap()));
    }
}
