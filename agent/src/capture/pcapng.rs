//! pcapng as kstall writes it, streaming: a Section Header, one Interface Description per
//! interface, Enhanced Packet Blocks as packets come, one Interface Statistics Block per
//! interface at the end. Host byte order (readers take it from the section's magic), timestamps
//! in nanoseconds (`if_tsresol` 9). Each block is `type | total length | body | total length`; an
//! option is `code u16 | length u16 | value padded to 4`, and `0, 0` ends the list. No allocation
//! per packet; [`Writer::bytes`] is the file's exact length, which the byte cap is decided on.

use std::io::{self, Write};

const SHB: u32 = 0x0A0D_0D0A;
const IDB: u32 = 0x0000_0001;
const ISB: u32 = 0x0000_0005;
const EPB: u32 = 0x0000_0006;
const BYTE_ORDER_MAGIC: u32 = 0x1A2B_3C4D;

/// Link types (tcpdump.org's registry).
pub const LINKTYPE_ETHERNET: u16 = 1;
pub const LINKTYPE_RAW: u16 = 101;

/// What the bytes of an EPB come to besides the packet: its header and trailer (32) and the
/// `epb_flags` option with the end of options (12).
const EPB_OVERHEAD: u64 = 32 + 12;

/// Room kept for the statistics blocks the end writes, whatever the byte cap.
pub const ISB_RESERVE: u64 = 2048;

/// `epb_flags`: direction (bits 0-1) and reception type (bits 2-4).
pub mod flags {
    pub const INBOUND: u32 = 0b01;
    pub const OUTBOUND: u32 = 0b10;
    pub const UNICAST: u32 = 0b001 << 2;
    pub const MULTICAST: u32 = 0b010 << 2;
    pub const BROADCAST: u32 = 0b011 << 2;
    pub const PROMISCUOUS: u32 = 0b100 << 2;
}

/// The section's header options.
#[derive(Debug, Clone, Default)]
pub struct Section {
    pub hardware: String,
    pub os: String,
    pub application: String,
    pub comment: Option<String>,
}

/// One interface.
#[derive(Debug, Clone, Default)]
pub struct Idb {
    pub linktype: u16,
    pub snaplen: u32,
    pub name: String,
    pub description: String,
    /// Address and netmask.
    pub ipv4: Vec<([u8; 4], [u8; 4])>,
    /// Address and prefix length.
    pub ipv6: Vec<([u8; 16], u8)>,
    pub mac: Option<[u8; 6]>,
    /// The filter's text, as given (libpcap's language).
    pub filter: Option<String>,
}

/// One interface's counters at the end.
#[derive(Debug, Clone, Default)]
pub struct Isb {
    pub start_ns: u64,
    pub end_ns: u64,
    /// Packets the kernel's filter accepted (`tp_packets`).
    pub accepted: u64,
    /// Packets the kernel dropped for want of socket buffer (`tp_drops`).
    pub dropped: u64,
    /// Packets written.
    pub delivered: u64,
    pub comment: Option<String>,
}

pub struct Writer<W: Write> {
    out: W,
    bytes: u64,
    interfaces: u32,
    block: Vec<u8>,
}

fn pad4(n: usize) -> usize {
    (4 - n % 4) % 4
}

/// A block's body under construction.
fn option(block: &mut Vec<u8>, code: u16, value: &[u8]) {
    let len = u16::try_from(value.len()).unwrap_or(u16::MAX);
    block.extend_from_slice(&code.to_ne_bytes());
    block.extend_from_slice(&len.to_ne_bytes());
    block.extend_from_slice(&value[..usize::from(len)]);
    block.extend(std::iter::repeat_n(0, pad4(usize::from(len))));
}

fn end_of_options(block: &mut Vec<u8>) {
    block.extend_from_slice(&[0; 4]);
}

fn split_ns(ns: u64) -> [u8; 8] {
    let mut out = [0; 8];
    out[..4].copy_from_slice(&((ns >> 32) as u32).to_ne_bytes());
    out[4..].copy_from_slice(&(ns as u32).to_ne_bytes());
    out
}

impl<W: Write> Writer<W> {
    /// Writes the section header.
    pub fn new(out: W, section: &Section) -> io::Result<Self> {
        let mut writer = Writer { out, bytes: 0, interfaces: 0, block: Vec::with_capacity(256) };
        let b = &mut writer.block;
        b.extend_from_slice(&BYTE_ORDER_MAGIC.to_ne_bytes());
        b.extend_from_slice(&1u16.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&u64::MAX.to_ne_bytes());
        if let Some(comment) = &section.comment {
            option(b, 1, comment.as_bytes());
        }
        option(b, 2, section.hardware.as_bytes());
        option(b, 3, section.os.as_bytes());
        option(b, 4, section.application.as_bytes());
        end_of_options(b);
        writer.flush_block(SHB)?;
        Ok(writer)
    }

    /// Describes the next interface; its id, for [`Writer::packet`].
    pub fn interface(&mut self, idb: &Idb) -> io::Result<u32> {
        let b = &mut self.block;
        b.extend_from_slice(&idb.linktype.to_ne_bytes());
        b.extend_from_slice(&0u16.to_ne_bytes());
        b.extend_from_slice(&idb.snaplen.to_ne_bytes());
        option(b, 2, idb.name.as_bytes());
        option(b, 3, idb.description.as_bytes());
        for (addr, mask) in &idb.ipv4 {
            option(b, 4, &[&addr[..], &mask[..]].concat());
        }
        for (addr, prefix) in &idb.ipv6 {
            option(b, 5, &[&addr[..], &[*prefix]].concat());
        }
        if let Some(mac) = &idb.mac {
            option(b, 6, mac);
        }
        option(b, 9, &[9]);
        if let Some(filter) = &idb.filter {
            option(b, 11, &[&[0u8][..], filter.as_bytes()].concat());
        }
        end_of_options(b);
        self.flush_block(IDB)?;
        self.interfaces += 1;
        Ok(self.interfaces - 1)
    }

    /// The bytes an EPB of `caplen` bytes of packet takes.
    pub fn packet_bytes(caplen: usize) -> u64 {
        EPB_OVERHEAD + (caplen + pad4(caplen)) as u64
    }

    /// One packet: `data` as captured, `orig_len` its length on the wire; the bytes written.
    pub fn packet(
        &mut self,
        if_id: u32,
        ts_ns: u64,
        data: &[u8],
        orig_len: u32,
        flags: u32,
    ) -> io::Result<u64> {
        let caplen = u32::try_from(data.len()).map_err(|_| io::Error::other("a packet over 4 GiB"))?;
        let total = Self::packet_bytes(data.len());
        let total32 = (total as u32).to_ne_bytes();
        let mut head = [0u8; 28];
        head[..4].copy_from_slice(&EPB.to_ne_bytes());
        head[4..8].copy_from_slice(&total32);
        head[8..12].copy_from_slice(&if_id.to_ne_bytes());
        head[12..20].copy_from_slice(&split_ns(ts_ns));
        head[20..24].copy_from_slice(&caplen.to_ne_bytes());
        head[24..28].copy_from_slice(&orig_len.to_ne_bytes());
        let mut tail = [0u8; 3 + 16];
        let pad = pad4(data.len());
        let mut t = pad;
        tail[t..t + 2].copy_from_slice(&2u16.to_ne_bytes());
        tail[t + 2..t + 4].copy_from_slice(&4u16.to_ne_bytes());
        tail[t + 4..t + 8].copy_from_slice(&flags.to_ne_bytes());
        t += 12; // and the end of options, zeros
        tail[t..t + 4].copy_from_slice(&total32);
        self.out.write_all(&head)?;
        self.out.write_all(data)?;
        self.out.write_all(&tail[..t + 4])?;
        self.bytes += total;
        Ok(total)
    }

    /// An interface's counters (written at the end).
    pub fn statistics(&mut self, if_id: u32, isb: &Isb) -> io::Result<()> {
        let b = &mut self.block;
        b.extend_from_slice(&if_id.to_ne_bytes());
        b.extend_from_slice(&split_ns(isb.end_ns));
        if let Some(comment) = &isb.comment {
            option(b, 1, comment.as_bytes());
        }
        option(b, 2, &split_ns(isb.start_ns));
        option(b, 3, &split_ns(isb.end_ns));
        option(b, 6, &isb.accepted.to_ne_bytes());
        option(b, 7, &isb.dropped.to_ne_bytes());
        option(b, 8, &isb.delivered.to_ne_bytes());
        end_of_options(b);
        self.flush_block(ISB)
    }

    /// The bytes written so far: the file's length.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Flushes; the output back.
    pub fn finish(mut self) -> io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }

    fn flush_block(&mut self, kind: u32) -> io::Result<()> {
        let total = (self.block.len() + 12) as u32;
        self.out.write_all(&kind.to_ne_bytes())?;
        self.out.write_all(&total.to_ne_bytes())?;
        self.out.write_all(&self.block)?;
        self.out.write_all(&total.to_ne_bytes())?;
        self.bytes += u64::from(total);
        self.block.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stream() -> Vec<u8> {
        let section = Section {
            hardware: "x86_64".into(),
            os: "Linux 6.1".into(),
            application: "kstall".into(),
            comment: None,
        };
        let mut w = Writer::new(Vec::new(), &section).unwrap();
        let lo = Idb { linktype: LINKTYPE_ETHERNET, snaplen: 256, name: "lo".into(), ..Default::default() };
        let eth0 = Idb {
            linktype: LINKTYPE_ETHERNET,
            snaplen: 256,
            name: "eth0".into(),
            description: "pod".into(),
            ipv4: vec![([10, 0, 0, 2], [255, 255, 255, 0])],
            mac: Some([2, 0, 0, 0, 0, 1]),
            filter: Some("tcp".into()),
            ..Default::default()
        };
        assert_eq!(w.interface(&lo).unwrap(), 0);
        assert_eq!(w.interface(&eth0).unwrap(), 1);
        let ts = 0x0000_0001_0000_0002;
        assert_eq!(w.packet(0, ts, &[], 60, flags::INBOUND | flags::UNICAST).unwrap(), 44);
        assert_eq!(w.packet(1, ts, &[0xaa], 1, flags::OUTBOUND).unwrap(), 48);
        assert_eq!(w.packet(1, ts, &[1, 2, 3, 4], 1500, 0).unwrap(), 48);
        let isb = Isb { start_ns: 5, end_ns: 7, accepted: 3, dropped: 1, delivered: 2, comment: None };
        w.statistics(1, &isb).unwrap();
        let len = w.bytes();
        let out = w.finish().unwrap();
        assert_eq!(len, out.len() as u64);
        out
    }

    /// The bytes as the specification lays them out, written here word by word.
    #[cfg(target_endian = "little")]
    #[test]
    fn the_blocks_are_laid_out_as_the_specification_says() {
        #[rustfmt::skip]
        let golden: Vec<u8> = [
            // SHB, 72 bytes: magic, 1.0, section length unknown.
            &b"\x0a\x0d\x0d\x0a\x48\x00\x00\x00\x4d\x3c\x2b\x1a\x01\x00\x00\x00"[..],
            b"\xff\xff\xff\xff\xff\xff\xff\xff",
            b"\x02\x00\x06\x00x86_64\x00\x00",
            b"\x03\x00\x09\x00Linux 6.1\x00\x00\x00",
            b"\x04\x00\x06\x00kstall\x00\x00",
            b"\x00\x00\x00\x00\x48\x00\x00\x00",
            // IDB lo, 44 bytes: Ethernet, snaplen 256, if_name, empty if_description, if_tsresol.
            b"\x01\x00\x00\x00\x2c\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\x00",
            b"\x02\x00\x02\x00lo\x00\x00",
            b"\x03\x00\x00\x00",
            b"\x09\x00\x01\x00\x09\x00\x00\x00",
            b"\x00\x00\x00\x00\x2c\x00\x00\x00",
            // IDB eth0, 80 bytes: + if_IPv4addr, if_MACaddr, if_filter.
            b"\x01\x00\x00\x00\x50\x00\x00\x00\x01\x00\x00\x00\x00\x01\x00\x00",
            b"\x02\x00\x04\x00eth0",
            b"\x03\x00\x03\x00pod\x00",
            b"\x04\x00\x08\x00\x0a\x00\x00\x02\xff\xff\xff\x00",
            b"\x06\x00\x06\x00\x02\x00\x00\x00\x00\x01\x00\x00",
            b"\x09\x00\x01\x00\x09\x00\x00\x00",
            b"\x0b\x00\x04\x00\x00tcp",
            b"\x00\x00\x00\x00\x50\x00\x00\x00",
            // EPB, caplen 0: if 0, ts high 1 low 2, caplen 0, orig 60, flags inbound unicast.
            b"\x06\x00\x00\x00\x2c\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00",
            b"\x00\x00\x00\x00\x3c\x00\x00\x00",
            b"\x02\x00\x04\x00\x05\x00\x00\x00\x00\x00\x00\x00\x2c\x00\x00\x00",
            // EPB, caplen 1, padded by 3; outbound.
            b"\x06\x00\x00\x00\x30\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00",
            b"\x01\x00\x00\x00\x01\x00\x00\x00\xaa\x00\x00\x00",
            b"\x02\x00\x04\x00\x02\x00\x00\x00\x00\x00\x00\x00\x30\x00\x00\x00",
            // EPB, caplen 4, no padding, no flags.
            b"\x06\x00\x00\x00\x30\x00\x00\x00\x01\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00",
            b"\x04\x00\x00\x00\xdc\x05\x00\x00\x01\x02\x03\x04",
            b"\x02\x00\x04\x00\x00\x00\x00\x00\x00\x00\x00\x00\x30\x00\x00\x00",
            // ISB of if 1 at 7 ns: start, end, filteraccept, osdrop, usrdeliv.
            b"\x05\x00\x00\x00\x58\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x07\x00\x00\x00",
            b"\x02\x00\x08\x00\x00\x00\x00\x00\x05\x00\x00\x00",
            b"\x03\x00\x08\x00\x00\x00\x00\x00\x07\x00\x00\x00",
            b"\x06\x00\x08\x00\x03\x00\x00\x00\x00\x00\x00\x00",
            b"\x07\x00\x08\x00\x01\x00\x00\x00\x00\x00\x00\x00",
            b"\x08\x00\x08\x00\x02\x00\x00\x00\x00\x00\x00\x00",
            b"\x00\x00\x00\x00\x58\x00\x00\x00",
        ]
        .concat();
        assert_eq!(stream(), golden);
    }

    /// An independent reader (pcap-file) reads back what was written.
    #[test]
    fn pcap_file_reads_it_back() {
        use pcap_file::pcapng::{
            Block, PcapNgReader,
            blocks::{
                enhanced_packet::EnhancedPacketOption,
                interface_description::InterfaceDescriptionOption as I,
                interface_statistics::InterfaceStatisticsOption as S,
            },
        };
        let bytes = stream();
        let mut reader = PcapNgReader::new(&bytes[..]).unwrap();
        let (mut idbs, mut epbs, mut isbs) = (vec![], vec![], vec![]);
        while let Some(block) = reader.next_block() {
            match block.unwrap() {
                Block::InterfaceDescription(b) => idbs.push(b.into_owned()),
                Block::EnhancedPacket(b) => epbs.push(b.into_owned()),
                Block::InterfaceStatistics(b) => isbs.push(b.into_owned()),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(idbs.len(), 2);
        let eth0 = &idbs[1];
        assert_eq!(eth0.snaplen, 256);
        assert!(eth0.options.contains(&I::IfName("eth0".into())));
        assert!(eth0.options.contains(&I::IfDescription("pod".into())));
        assert!(eth0.options.contains(&I::IfTsResol(9)));
        assert!(eth0.options.contains(&I::IfFilter(b"\0tcp"[..].into())));
        assert!(eth0.options.contains(&I::IfMacAddr([2, 0, 0, 0, 0, 1][..].into())));
        let lens: Vec<(u32, usize, u32)> =
            epbs.iter().map(|e| (e.interface_id, e.data.len(), e.original_len)).collect();
        assert_eq!(lens, [(0, 0, 60), (1, 1, 1), (1, 4, 1500)]);
        assert_eq!(epbs[0].timestamp.as_nanos(), 0x0000_0001_0000_0002);
        assert_eq!(epbs[1].options, [EnhancedPacketOption::Flags(flags::OUTBOUND)]);
        assert_eq!(isbs.len(), 1);
        for counter in [S::IsbFilterAccept(3), S::IsbOsDrop(1), S::IsbUsrDeliv(2)] {
            assert!(isbs[0].options.contains(&counter), "{:?}", isbs[0].options);
        }
    }
}
