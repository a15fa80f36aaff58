//! The kernel filter a packet socket takes: the operator's filter in libpcap's language (the one
//! tcpdump users know), compiled by libpcap itself — loaded with `dlopen` when a filter is given,
//! so kstall runs where libpcap is not installed and needs no `-dev` package to build — and the
//! snapshot length as a classic BPF tail that returns, per packet, where its headers end.
//!
//! Names are refused before libpcap sees the text: it would resolve them (DNS, services), and the
//! agent looks nothing up.

use std::{
    ffi::{CStr, CString, c_char, c_int, c_uint, c_void},
    sync::{Mutex, OnceLock},
};

use libc::sock_filter;

/// How much of each packet is kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Snaplen {
    /// Up to the end of the transport header, no payload ([`headers_tail`]).
    Headers,
    Bytes(u32),
    Full,
}

impl Snaplen {
    pub const FULL: u32 = 262_144;
    pub const MIN: u32 = 64;
    /// What the IDB says for `headers`: at least the largest the tail returns (134).
    pub const HEADERS_IDB: u32 = 256;
    /// What the tail keeps of a packet it cannot parse (VLAN, IPv6 extension headers, not IP):
    /// 14 Ethernet + 4 802.1Q + 40 IPv6 + 60 TCP with every option is 118.
    pub const FALLBACK: u32 = 128;

    /// `headers`, `full` or a number of bytes (64 to 262144).
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "headers" => Ok(Snaplen::Headers),
            "full" => Ok(Snaplen::Full),
            n => match n.parse::<u32>() {
                Ok(n) if (Self::MIN..=Self::FULL).contains(&n) => Ok(Snaplen::Bytes(n)),
                _ => Err(format!(
                    "--snaplen {text:?}: headers (the default: no payload), full, or a number of bytes from {} to {}",
                    Self::MIN,
                    Self::FULL
                )),
            },
        }
    }

    /// The snapshot length the interface description states.
    pub fn idb(self) -> u32 {
        match self {
            Snaplen::Headers => Self::HEADERS_IDB,
            Snaplen::Bytes(n) => n,
            Snaplen::Full => Self::FULL,
        }
    }
}

/// The link layer a filter is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// Ethernet frames (veth, loopback).
    Ethernet,
    /// Bare IP packets (tun, wireguard: `ARPHRD_NONE`).
    Raw,
}

impl Link {
    /// libpcap's DLT on Linux.
    fn dlt(self) -> c_int {
        match self {
            Link::Ethernet => 1,
            Link::Raw => 12,
        }
    }

    /// Where the IP header starts.
    fn ip_offset(self) -> u32 {
        match self {
            Link::Ethernet => 14,
            Link::Raw => 0,
        }
    }
}

/// A program for `SO_ATTACH_FILTER`.
#[derive(Debug, Clone)]
pub struct Program {
    pub insns: Vec<sock_filter>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FilterError {
    Syntax { filter: String, why: String },
    Name(String),
    NoLibpcap,
    TooLong,
    TooManyInstructions(usize),
    ReturnsA,
}

impl std::fmt::Display for FilterError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FilterError::Syntax { filter, why } => write!(f, "filter {filter:?}: {why} (libpcap)"),
            FilterError::Name(name) => write!(
                f,
                "filter: {name:?} is a name, and the agent looks nothing up: give its address (host 10.55.0.1) or the \
                 port number"
            ),
            FilterError::NoLibpcap => f.write_str(
                "filters need libpcap (libpcap.so.0.8, Debian's libpcap0.8), which is not where the agent runs: \
                 capture without --filter",
            ),
            FilterError::TooLong => write!(f, "filter: longer than {MAX_FILTER} characters"),
            FilterError::TooManyInstructions(n) => write!(
                f,
                "filter compiles to {n} instructions; the kernel takes {MAX_INSNS} with kstall's headers-only tail"
            ),
            FilterError::ReturnsA => {
                f.write_str("filter: libpcap's program returns a computed length, which the headers-only tail cannot take")
            }
        }
    }
}

const MAX_FILTER: usize = 1024;
const MAX_INSNS: usize = 4096;

/// Compiles `filter` (none: every packet) for `link`, keeping `snap` of each packet.
pub fn compile(filter: Option<&str>, link: Link, snap: Snaplen) -> Result<Program, FilterError> {
    let accepting = match filter.map(str::trim).filter(|f| !f.is_empty()) {
        None => vec![ret(u32::MAX)],
        Some(text) => {
            if text.len() > MAX_FILTER {
                return Err(FilterError::TooLong);
            }
            if let Some(name) = names_in(text) {
                return Err(FilterError::Name(name));
            }
            Libpcap::get().ok_or(FilterError::NoLibpcap)?.compile(text, link)?
        }
    };
    let insns = match snap {
        Snaplen::Headers if filter.is_none_or(|f| f.trim().is_empty()) => headers_tail(link),
        Snaplen::Headers => with_headers_tail(accepting, link)?,
        Snaplen::Bytes(n) => keep(accepting, n),
        Snaplen::Full => keep(accepting, Snaplen::FULL),
    };
    if insns.len() > MAX_INSNS {
        return Err(FilterError::TooManyInstructions(insns.len()));
    }
    Ok(Program { insns })
}

// Classic BPF opcodes.
const LD_H_ABS: u16 = 0x28;
const LD_B_ABS: u16 = 0x30;
const LD_B_IND: u16 = 0x50;
const LDX_B_MSH: u16 = 0xb1;
const ALU_ADD_K: u16 = 0x04;
const ALU_ADD_X: u16 = 0x0c;
const ALU_LSH_K: u16 = 0x64;
const ALU_RSH_K: u16 = 0x74;
const JMP_JA: u16 = 0x05;
const JMP_JEQ_K: u16 = 0x15;
const JMP_JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;
const RET_A: u16 = 0x16;
const MISC_TXA: u16 = 0x87;

fn insn(code: u16, k: u32) -> sock_filter {
    sock_filter { code, jt: 0, jf: 0, k }
}

fn ret(k: u32) -> sock_filter {
    insn(RET_K, k)
}

/// Every accepting return of `program` becomes `ret #n`.
fn keep(mut program: Vec<sock_filter>, n: u32) -> Vec<sock_filter> {
    for i in program.iter_mut().filter(|i| i.code == RET_K && i.k != 0) {
        i.k = n;
    }
    program
}

/// Every accepting return of libpcap's `program` becomes a jump to the headers-only tail of
/// `link`, appended after it; the rejections stay. A program that returns a computed length is
/// refused.
pub fn with_headers_tail(program: Vec<sock_filter>, link: Link) -> Result<Vec<sock_filter>, FilterError> {
    with_tail(program, &headers_tail(link))
}

fn with_tail(mut program: Vec<sock_filter>, tail: &[sock_filter]) -> Result<Vec<sock_filter>, FilterError> {
    if program.iter().any(|i| i.code == RET_A) {
        return Err(FilterError::ReturnsA);
    }
    let n = program.len();
    for (at, i) in program.iter_mut().enumerate() {
        if i.code == RET_K && i.k != 0 {
            *i = insn(JMP_JA, (n - at - 1) as u32);
        }
    }
    program.extend_from_slice(tail);
    Ok(program)
}

/// One instruction of [`assemble`]: conditional jumps name their targets.
enum Asm {
    I(sock_filter),
    /// A conditional jump: its code, k, and the labels for true and false (`""`: the next one).
    J(u16, u32, &'static str, &'static str),
    Label(&'static str),
}

fn assemble(code: &[Asm]) -> Vec<sock_filter> {
    let mut at = std::collections::HashMap::new();
    let mut n = 0usize;
    for a in code {
        match a {
            Asm::Label(l) => {
                at.insert(*l, n);
            }
            _ => n += 1,
        }
    }
    let mut out = Vec::with_capacity(n);
    for a in code {
        match a {
            Asm::I(i) => out.push(*i),
            Asm::J(op, k, jt, jf) => {
                let here = out.len() + 1;
                let off = |l: &str| if l.is_empty() { 0 } else { (at[l] - here) as u8 };
                out.push(sock_filter { code: *op, jt: off(jt), jf: off(jf), k: *k });
            }
            Asm::Label(_) => {}
        }
    }
    out
}

/// Returns, per packet, where its transport header ends: IPv4 TCP the IP and TCP headers with
/// their options, UDP 8 bytes more than IP, ICMP 8 and the 28 of the quoted header, an IPv4
/// fragment or another protocol the IP header; IPv6 TCP (no extension header) the same, UDP 48,
/// ICMPv6 96; ARP 42; anything else [`Snaplen::FALLBACK`].
pub fn headers_tail(link: Link) -> Vec<sock_filter> {
    use Asm::{I, J, Label as L};
    let o = link.ip_offset();
    let mut code = match link {
        Link::Ethernet => vec![
            I(insn(LD_H_ABS, 12)),
            J(JMP_JEQ_K, 0x0800, "v4", ""),
            J(JMP_JEQ_K, 0x86dd, "v6", ""),
            J(JMP_JEQ_K, 0x0806, "arp", "other"),
            L("arp"),
            I(ret(42)),
        ],
        Link::Raw => vec![
            I(insn(LD_B_ABS, 0)),
            I(insn(ALU_RSH_K, 4)),
            J(JMP_JEQ_K, 4, "v4", ""),
            J(JMP_JEQ_K, 6, "v6", "other"),
        ],
    };
    code.extend([
        L("other"),
        I(ret(Snaplen::FALLBACK)),
        L("v4"),
        I(insn(LDX_B_MSH, o)),
        I(insn(LD_H_ABS, o + 6)),
        J(JMP_JSET_K, 0x1fff, "ip", ""),
        I(insn(LD_B_ABS, o + 9)),
        J(JMP_JEQ_K, 6, "tcp", ""),
        J(JMP_JEQ_K, 17, "udp", ""),
        J(JMP_JEQ_K, 1, "icmp", "ip"),
        L("ip"),
        I(insn(MISC_TXA, 0)),
        I(insn(ALU_ADD_K, o)),
        I(insn(RET_A, 0)),
        L("udp"),
        I(insn(MISC_TXA, 0)),
        I(insn(ALU_ADD_K, o + 8)),
        I(insn(RET_A, 0)),
        L("icmp"),
        I(insn(MISC_TXA, 0)),
        I(insn(ALU_ADD_K, o + 8 + 28)),
        I(insn(RET_A, 0)),
        L("tcp"),
        I(insn(LD_B_IND, o + 12)),
        I(insn(ALU_RSH_K, 4)),
        I(insn(ALU_LSH_K, 2)),
        I(insn(ALU_ADD_X, 0)),
        I(insn(ALU_ADD_K, o)),
        I(insn(RET_A, 0)),
        L("v6"),
        I(insn(LD_B_ABS, o + 6)),
        J(JMP_JEQ_K, 6, "tcp6", ""),
        J(JMP_JEQ_K, 17, "udp6", ""),
        J(JMP_JEQ_K, 58, "icmp6", "other6"),
        L("other6"),
        I(ret(Snaplen::FALLBACK)),
        L("udp6"),
        I(ret(o + 48)),
        L("icmp6"),
        I(ret(o + 96)),
        L("tcp6"),
        I(insn(LD_B_ABS, o + 40 + 12)),
        I(insn(ALU_RSH_K, 4)),
        I(insn(ALU_LSH_K, 2)),
        I(insn(ALU_ADD_K, o + 40)),
        I(insn(RET_A, 0)),
    ]);
    assemble(&code)
}

/// The words of libpcap's language (libpcap 1.10's `scanner.l` and pcap-filter(7)): primitives,
/// qualifiers, protocol names, and the names of ICMP types and TCP flags it defines itself. Any
/// other word is a name it would look up.
const KEYWORDS: &[&str] = &[
    "dst",
    "src",
    "host",
    "gateway",
    "net",
    "netmask",
    "mask",
    "port",
    "portrange",
    "less",
    "greater",
    "proto",
    "protochain",
    "byte",
    "link",
    "ether",
    "fddi",
    "tr",
    "wlan",
    "ppp",
    "slip",
    "arp",
    "rarp",
    "ip",
    "sctp",
    "tcp",
    "udp",
    "icmp",
    "igmp",
    "igrp",
    "pim",
    "vrrp",
    "carp",
    "ip6",
    "icmp6",
    "ah",
    "esp",
    "atalk",
    "aarp",
    "decnet",
    "lat",
    "sca",
    "moprc",
    "mopdl",
    "iso",
    "esis",
    "es-is",
    "isis",
    "is-is",
    "l1",
    "l2",
    "iih",
    "lsp",
    "snp",
    "csnp",
    "psnp",
    "clnp",
    "stp",
    "ipx",
    "netbeui",
    "broadcast",
    "multicast",
    "and",
    "or",
    "not",
    "len",
    "inbound",
    "outbound",
    "ifindex",
    "vlan",
    "mpls",
    "pppoed",
    "pppoes",
    "geneve",
    "vxlan",
    "lane",
    "llc",
    "ifname",
    "on",
    "type",
    "subtype",
    "direction",
    "dir",
    "addr1",
    "addr2",
    "addr3",
    "addr4",
    "ra",
    "ta",
    "radio",
    "icmptype",
    "icmpcode",
    "icmp-echoreply",
    "icmp-unreach",
    "icmp-sourcequench",
    "icmp-redirect",
    "icmp-echo",
    "icmp-routeradvert",
    "icmp-routersolicit",
    "icmp-timxceed",
    "icmp-paramprob",
    "icmp-tstamp",
    "icmp-tstampreply",
    "icmp-ireq",
    "icmp-ireqreply",
    "icmp-maskreq",
    "icmp-maskreply",
    "icmp6type",
    "icmp6code",
    "icmp6-destinationunreach",
    "icmp6-packettoobig",
    "icmp6-timeexceeded",
    "icmp6-parameterproblem",
    "icmp6-echo",
    "icmp6-echoreply",
    "icmp6-multicastlistenerquery",
    "icmp6-multicastlistenerreportv1",
    "icmp6-multicastlistenerdone",
    "icmp6-routersolicit",
    "icmp6-routeradvert",
    "icmp6-neighborsolicit",
    "icmp6-neighboradvert",
    "icmp6-redirect",
    "icmp6-routerrenum",
    "icmp6-nodeinformationquery",
    "icmp6-nodeinformationresponse",
    "icmp6-ineighbordiscoverysolicit",
    "icmp6-ineighbordiscoveryadvert",
    "icmp6-multicastlistenerreportv2",
    "icmp6-homeagentdiscoveryrequest",
    "icmp6-homeagentdiscoveryreply",
    "icmp6-mobileprefixsolicit",
    "icmp6-mobileprefixadvert",
    "icmp6-certpathsolicit",
    "icmp6-certpathadvert",
    "icmp6-multicastrouteradvert",
    "icmp6-multicastroutersolicit",
    "icmp6-multicastrouterterm",
    "tcpflags",
    "tcp-fin",
    "tcp-syn",
    "tcp-rst",
    "tcp-push",
    "tcp-ack",
    "tcp-urg",
    "tcp-ece",
    "tcp-cwr",
];

/// The first word of `filter` libpcap would look up (a host, network, port or protocol name).
pub fn names_in(filter: &str) -> Option<String> {
    filter
        .split(|c: char| c.is_whitespace() || "()!&|<>=[]+*/%^".contains(c))
        .map(|t| t.trim_start_matches('\\'))
        .filter(|t| !t.is_empty() && *t != "-")
        .find(|t| !is_literal(t) && !KEYWORDS.contains(&t.to_ascii_lowercase().as_str()))
        .map(str::to_string)
}

fn is_literal(token: &str) -> bool {
    let number = |t: &str| {
        t.strip_prefix("0x")
            .or_else(|| t.strip_prefix("0X"))
            .map_or(!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()), |h| {
                !h.is_empty() && h.bytes().all(|b| b.is_ascii_hexdigit())
            })
    };
    let (address, prefix) = token.split_once('/').unwrap_or((token, "0"));
    let dotted = |t: &str| {
        let parts: Vec<&str> = t.split('.').collect();
        parts.len() <= 4 && parts.iter().all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    };
    let mac = |t: &str| {
        let parts: Vec<&str> = t.split([':', '-', '.']).collect();
        matches!(parts.len(), 3 | 6)
            && parts.iter().all(|p| (1..=4).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    number(token)
        // A port range, or an accessor's offset and size (`ip[2:2]`).
        || token.split_once(['-', ':']).is_some_and(|(a, b)| number(a) && number(b))
        || (number(prefix) && (dotted(address) || address.parse::<std::net::Ipv6Addr>().is_ok()))
        || mac(token)
}

/// libpcap, loaded once; its compiler is called under a lock.
struct Libpcap {
    lock: Mutex<()>,
    open_dead: OpenDead,
    compile: Compile,
    geterr: GetErr,
    freecode: FreeCode,
    close: Close,
}

type OpenDead = unsafe extern "C" fn(c_int, c_int) -> *mut c_void;
type Compile = unsafe extern "C" fn(*mut c_void, *mut BpfProgram, *const c_char, c_int, c_uint) -> c_int;
type GetErr = unsafe extern "C" fn(*mut c_void) -> *const c_char;
type FreeCode = unsafe extern "C" fn(*mut BpfProgram);
type Close = unsafe extern "C" fn(*mut c_void);

#[repr(C)]
struct BpfProgram {
    len: c_uint,
    insns: *mut sock_filter,
}

const PCAP_NETMASK_UNKNOWN: c_uint = 0xffff_ffff;

impl Libpcap {
    fn get() -> Option<&'static Libpcap> {
        static LOADED: OnceLock<Option<Libpcap>> = OnceLock::new();
        LOADED.get_or_init(Self::load).as_ref()
    }

    fn load() -> Option<Libpcap> {
        let handle = [c"libpcap.so.0.8", c"libpcap.so.1"].iter().find_map(|name| {
            // SAFETY: a library name; the handle is kept for the process's life.
            let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            (!h.is_null()).then_some(h)
        })?;
        let symbol = |name: &CStr| {
            // SAFETY: a symbol of the library just opened.
            let s = unsafe { libc::dlsym(handle, name.as_ptr()) };
            (!s.is_null()).then_some(s)
        };
        // SAFETY: the symbols are libpcap's, with these C prototypes (pcap/pcap.h).
        unsafe {
            Some(Libpcap {
                lock: Mutex::new(()),
                open_dead: std::mem::transmute::<*mut c_void, OpenDead>(symbol(c"pcap_open_dead")?),
                compile: std::mem::transmute::<*mut c_void, Compile>(symbol(c"pcap_compile")?),
                geterr: std::mem::transmute::<*mut c_void, GetErr>(symbol(c"pcap_geterr")?),
                freecode: std::mem::transmute::<*mut c_void, FreeCode>(symbol(c"pcap_freecode")?),
                close: std::mem::transmute::<*mut c_void, Close>(symbol(c"pcap_close")?),
            })
        }
    }

    fn compile(&self, text: &str, link: Link) -> Result<Vec<sock_filter>, FilterError> {
        let syntax = |why: String| FilterError::Syntax { filter: text.to_string(), why };
        let c_text = CString::new(text).map_err(|_| syntax("a NUL character".into()))?;
        let _guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: libpcap's API as documented: a dead handle for compiling, freed below; the
        // program's instructions are copied out before pcap_freecode.
        unsafe {
            let p = (self.open_dead)(link.dlt(), Snaplen::FULL as c_int);
            if p.is_null() {
                return Err(syntax("pcap_open_dead failed".into()));
            }
            let mut program = BpfProgram { len: 0, insns: std::ptr::null_mut() };
            let rc = (self.compile)(p, &mut program, c_text.as_ptr(), 1, PCAP_NETMASK_UNKNOWN);
            let result = if rc != 0 {
                let why = CStr::from_ptr((self.geterr)(p)).to_string_lossy().into_owned();
                Err(syntax(why))
            } else {
                let insns = std::slice::from_raw_parts(program.insns, program.len as usize).to_vec();
                (self.freecode)(&mut program);
                Ok(insns)
            };
            (self.close)(p);
            result
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic BPF interpreter of the instructions above and libpcap's: the length it returns
    /// (0: dropped; a load past the end drops, as the kernel does).
    fn run(program: &[sock_filter], packet: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        let mut mem = [0u32; 16];
        let load = |at: u32, size: usize| -> Option<u32> {
            let at = at as usize;
            let bytes = packet.get(at..at + size)?;
            Some(bytes.iter().fold(0, |v, b| (v << 8) | u32::from(*b)))
        };
        loop {
            let i = program[pc];
            pc += 1;
            let (class, k) = (i.code & 0x07, i.k);
            let src = if i.code & 0x08 != 0 { x } else { k };
            match class {
                0x00 | 0x01 => {
                    let size = match i.code & 0x18 {
                        0x00 => 4,
                        0x08 => 2,
                        _ => 1,
                    };
                    let value = match i.code & 0xe0 {
                        0x00 => Some(k),
                        0x20 => load(k, size),
                        0x40 => load(x.wrapping_add(k), size),
                        0x60 => Some(mem[k as usize]),
                        0x80 => Some(packet.len() as u32),
                        0xa0 => load(k, 1).map(|b| 4 * (b & 0xf)),
                        m => panic!("mode {m:#x}"),
                    };
                    let Some(value) = value else { return 0 };
                    if class == 0 { a = value } else { x = value }
                }
                0x02 => mem[k as usize] = a,
                0x03 => mem[k as usize] = x,
                0x04 => {
                    a = match i.code & 0xf0 {
                        0x00 => a.wrapping_add(src),
                        0x10 => a.wrapping_sub(src),
                        0x20 => a.wrapping_mul(src),
                        0x30 => a.checked_div(src).unwrap_or(0),
                        0x40 => a | src,
                        0x50 => a & src,
                        0x60 => a.wrapping_shl(src),
                        0x70 => a.wrapping_shr(src),
                        0x80 => a.wrapping_neg(),
                        op => panic!("alu {op:#x}"),
                    }
                }
                0x05 => {
                    let taken = match i.code & 0xf0 {
                        0x00 => {
                            pc += k as usize;
                            continue;
                        }
                        0x10 => a == src,
                        0x20 => a > src,
                        0x30 => a >= src,
                        0x40 => a & src != 0,
                        op => panic!("jmp {op:#x}"),
                    };
                    pc += usize::from(if taken { i.jt } else { i.jf });
                }
                0x06 => return if i.code & 0x18 == 0x10 { a } else { k },
                _ => {
                    if i.code == MISC_TXA {
                        a = x
                    } else {
                        x = a
                    }
                }
            }
        }
    }

    fn ether(kind: u16, rest: &[u8]) -> Vec<u8> {
        let mut f = vec![0u8; 12];
        f.extend_from_slice(&kind.to_be_bytes());
        f.extend_from_slice(rest);
        f
    }

    /// IPv4 with `ip_options` option bytes, then `proto`'s header: TCP with `tcp_options`.
    fn ipv4(proto: u8, ip_options: usize, fragment: u16, tcp_options: usize) -> Vec<u8> {
        let mut ip = vec![0u8; 20 + ip_options];
        ip[0] = 0x40 | ((20 + ip_options) / 4) as u8;
        ip[6..8].copy_from_slice(&fragment.to_be_bytes());
        ip[9] = proto;
        let mut l4 = vec![0u8; 20 + tcp_options + 100];
        l4[12] = (((20 + tcp_options) / 4) as u8) << 4;
        ip.extend(l4);
        ether(0x0800, &ip)
    }

    #[test]
    fn the_headers_tail_keeps_each_packet_up_to_its_transport_header() {
        let tail = headers_tail(Link::Ethernet);
        assert_eq!(run(&tail, &ipv4(6, 0, 0, 0)), 54);
        assert_eq!(run(&tail, &ipv4(6, 0, 0, 20)), 74);
        assert_eq!(run(&tail, &ipv4(6, 40, 0, 40)), 134, "the largest: both headers' options full");
        assert_eq!(run(&tail, &ipv4(6, 0, 0x2001, 0)), 34, "a fragment: its IP header");
        assert_eq!(run(&tail, &ipv4(17, 0, 0, 0)), 42);
        assert_eq!(run(&tail, &ipv4(1, 0, 0, 0)), 70);
        assert_eq!(run(&tail, &ipv4(47, 0, 0, 0)), 34);
        let ipv6 = |next: u8, tcp_options: usize| {
            let mut p = vec![0u8; 40 + 20 + tcp_options + 64];
            p[0] = 0x60;
            p[6] = next;
            p[40 + 12] = (((20 + tcp_options) / 4) as u8) << 4;
            ether(0x86dd, &p)
        };
        assert_eq!(run(&tail, &ipv6(6, 12)), 86, "TCP with SACK");
        assert_eq!(run(&tail, &ipv6(17, 0)), 62);
        assert_eq!(run(&tail, &ipv6(58, 0)), 110);
        assert_eq!(run(&tail, &ipv6(0, 0)), 128, "a hop-by-hop header: the fallback");
        assert_eq!(run(&tail, &ether(0x8100, &[0; 100])), 128, "VLAN: the fallback");
        assert_eq!(run(&tail, &ether(0x0806, &[0; 28])), 42);
        // Bare IP: the same, 14 bytes fewer.
        let raw = headers_tail(Link::Raw);
        assert_eq!(run(&raw, &ipv4(6, 0, 0, 20)[14..]), 60);
        assert_eq!(run(&raw, &ipv4(17, 0, 0, 0)[14..]), 28);
        assert_eq!(run(&raw, &[0u8; 40]), 128);
    }

    #[test]
    fn accepting_returns_jump_to_the_tail_and_rejections_stay() {
        let program = vec![sock_filter { code: JMP_JEQ_K, jt: 0, jf: 1, k: 0 }, ret(262_144), ret(0)];
        let tail = headers_tail(Link::Ethernet);
        let joined = with_tail(program.clone(), &tail).unwrap();
        assert_eq!(joined.len(), 3 + tail.len());
        assert_eq!((joined[1].code, joined[1].k), (JMP_JA, 1));
        assert_eq!((joined[2].code, joined[2].k), (RET_K, 0));
        assert_eq!(keep(program.clone(), 96)[1].k, 96);
        let computed = vec![insn(RET_A, 0)];
        assert_eq!(with_tail(computed, &tail).unwrap_err(), FilterError::ReturnsA);
        // No filter: the tail alone; a fixed length: one return.
        assert_eq!(compile(None, Link::Ethernet, Snaplen::Headers).unwrap().insns.len(), tail.len());
        let fixed = compile(None, Link::Ethernet, Snaplen::Bytes(200)).unwrap().insns;
        assert_eq!(run(&fixed, &ipv4(6, 0, 0, 0)), 200);
    }

    #[test]
    fn names_are_refused_and_the_language_passes() {
        for ok in [
            "tcp[tcpflags] & (tcp-syn|tcp-rst) != 0",
            "net fd00::/8",
            "tcp and (host 10.0.0.1 or port 2049 or port 15001)",
            "ip[2:2] - ((ip[0]&0xf)<<2) > 0",
            "udp portrange 1000-2000 and not ether host 02:00:00:00:00:01",
            "net 10.55 and icmp[icmptype] == icmp-echo",
            "ip6 and dst host ::1",
        ] {
            assert_eq!(names_in(ok), None, "{ok}");
        }
        assert_eq!(names_in("host db"), Some("db".into()));
        assert_eq!(names_in("tcp port nfs"), Some("nfs".into()));
        assert_eq!(
            compile(Some("host nfs-server"), Link::Ethernet, Snaplen::Headers).unwrap_err().to_string(),
            "filter: \"nfs-server\" is a name, and the agent looks nothing up: give its address (host 10.55.0.1) or \
             the port number"
        );
        let long = "tcp or ".repeat(200) + "tcp";
        assert_eq!(compile(Some(&long), Link::Ethernet, Snaplen::Headers).unwrap_err(), FilterError::TooLong);
    }

    fn libpcap_or_skip(test: &str) -> bool {
        if Libpcap::get().is_some() {
            return true;
        }
        assert_ne!(
            std::env::var("KSTALL_KERNEL_TESTS").as_deref(),
            Ok("require"),
            "{test}: libpcap.so.0.8 is required (cargo xtask bootstrap installs libpcap0.8)"
        );
        eprintln!("skipping {test}: libpcap.so.0.8 is not installed");
        false
    }

    #[test]
    fn libpcaps_program_with_the_tail_keeps_the_headers_of_what_it_accepts() {
        if !libpcap_or_skip("libpcaps_program_with_the_tail_keeps_the_headers_of_what_it_accepts") {
            return;
        }
        let program = compile(Some("tcp and port 2049"), Link::Ethernet, Snaplen::Headers).unwrap().insns;
        let syn = |port: u16| {
            let mut f = ipv4(6, 0, 0, 20);
            f[14 + 20 + 2..14 + 20 + 4].copy_from_slice(&port.to_be_bytes());
            f
        };
        assert_eq!(run(&program, &syn(2049)), 74);
        assert_eq!(run(&program, &syn(2050)), 0);
        let full = compile(Some("tcp and port 2049"), Link::Ethernet, Snaplen::Full).unwrap().insns;
        assert_eq!(run(&full, &syn(2049)), Snaplen::FULL);
        let raw = compile(Some("tcp and port 2049"), Link::Raw, Snaplen::Headers).unwrap().insns;
        assert_eq!(run(&raw, &syn(2049)[14..]), 60);
        assert_eq!(
            compile(Some("tcp and (port 2049"), Link::Ethernet, Snaplen::Headers).unwrap_err().to_string(),
            "filter \"tcp and (port 2049\": can't parse filter expression: syntax error (libpcap)"
        );
    }

    #[test]
    fn snaplen_texts() {
        assert_eq!(Snaplen::parse("headers"), Ok(Snaplen::Headers));
        assert_eq!(Snaplen::parse("full").map(Snaplen::idb), Ok(262_144));
        assert_eq!(Snaplen::parse("96"), Ok(Snaplen::Bytes(96)));
        assert_eq!(
            Snaplen::parse("10").unwrap_err(),
            "--snaplen \"10\": headers (the default: no payload), full, or a number of bytes from 64 to 262144"
        );
        assert_eq!(Snaplen::Headers.idb(), 256);
    }
}
