//! `kstall capture --filter`: the operator's text, checked for names before libpcap sees it
//! (`capture::filter::names_in`), and the headers-only tail joined to any classic BPF program
//! (`with_headers_tail`, which rewrites libpcap's output). Neither panics; a well-formed program
//! (every jump inside it, ending in a return) stays well-formed, its rejections kept, and the
//! tail's own jumps too.
#![no_main]

use kstall::capture::filter::{Link, names_in, with_headers_tail};
use libc::sock_filter;
use libfuzzer_sys::fuzz_target;

const JMP: u16 = 0x05;
const RET: u16 = 0x06;

/// Every jump lands on an instruction of the program, and the last one returns.
fn well_formed(program: &[sock_filter]) -> bool {
    let n = program.len();
    let lands = |at: usize, off: usize| at + 1 + off < n;
    program.last().is_some_and(|i| i.code & 0x07 == RET)
        && program.iter().enumerate().all(|(at, i)| match (i.code & 0x07, i.code & 0xf0) {
            (JMP, 0x00) => lands(at, i.k as usize),
            (JMP, _) => lands(at, usize::from(i.jt)) && lands(at, usize::from(i.jf)),
            _ => true,
        })
}

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = names_in(text);
    }
    let program: Vec<sock_filter> = data
        .chunks_exact(8)
        .map(|c| sock_filter {
            code: u16::from_le_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    let was = well_formed(&program);
    for link in [Link::Ethernet, Link::Raw] {
        let Ok(joined) = with_headers_tail(program.clone(), link) else { continue };
        assert!(joined.len() > program.len());
        if was {
            assert!(well_formed(&joined), "{link:?}: a jump out of the program");
            let rejections = |p: &[sock_filter]| p.iter().filter(|i| i.code == RET && i.k == 0).count();
            assert!(rejections(&joined) >= rejections(&program));
        }
    }
});
