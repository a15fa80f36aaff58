//! Struct offsets, enum values and tracepoint prototypes from the running kernel's BTF.
//!
//! Rust eBPF code has no CO-RE relocations, so every offset a program uses is resolved here at load
//! time and handed to the program in a global. A field that cannot be resolved is an error the
//! probe reports (and stays off for); nothing falls back to a compiled-in guess.

use std::path::Path;

use btf_rs::{Btf, Type};

#[derive(Debug, thiserror::Error)]
pub enum BtfError {
    #[error("cannot read BTF {path}: {message}")]
    Read { path: String, message: String },
    #[error("BTF has no {0}")]
    Missing(String),
    #[error("BTF field {0} is a bitfield or not byte-aligned")]
    Unaligned(String),
    #[error("bad BTF field path {0}")]
    BadPath(String),
    #[error("BTF: {0}")]
    Parse(String),
}

fn parse_err(e: btf_rs::Error) -> BtfError {
    BtfError::Parse(e.to_string())
}

/// One kernel object's BTF: vmlinux, or a module's split BTF on top of vmlinux.
pub struct KernelBtf {
    btf: Btf,
}

impl KernelBtf {
    pub const SYSFS_VMLINUX: &'static str = "/sys/kernel/btf/vmlinux";

    pub fn vmlinux_from_sys_fs() -> Result<Self, BtfError> {
        Self::from_file(Path::new(Self::SYSFS_VMLINUX))
    }

    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let bytes = std::fs::read(path)
            .map_err(|e| BtfError::Read { path: path.display().to_string(), message: e.to_string() })?;
        Self::from_bytes(&bytes)
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Self, BtfError> {
        Ok(Self { btf: Btf::from_bytes(bytes).map_err(parse_err)? })
    }

    /// A loaded module's BTF (`/sys/kernel/btf/<module>`), split on top of `self`.
    pub fn module_from_sys_fs(&self, module: &str) -> Result<Self, BtfError> {
        let path = Path::new("/sys/kernel/btf").join(module);
        let bytes = std::fs::read(&path)
            .map_err(|e| BtfError::Read { path: path.display().to_string(), message: e.to_string() })?;
        self.module_from_bytes(&bytes)
    }

    pub fn module_from_bytes(&self, bytes: &[u8]) -> Result<Self, BtfError> {
        Ok(Self { btf: Btf::from_split_bytes(bytes, &self.btf).map_err(parse_err)? })
    }

    /// Byte offset of `path` (e.g. `__sk_common.skc_net`, `tuplehash[1].tuple.src.u.all`) inside
    /// `struct struct_name`. Anonymous unions and structs are searched through, as C does.
    pub fn offset_of(&self, struct_name: &str, path: &str) -> Result<u32, BtfError> {
        let what = || format!("struct {struct_name}.{path}");
        let components: Vec<_> = path
            .split('.')
            .map(parse_component)
            .collect::<Option<_>>()
            .ok_or_else(|| BtfError::BadPath(what()))?;
        let mut ty = self.named_struct(struct_name)?;
        let mut offset = 0u32;
        for (name, index) in components {
            let (Type::Struct(s) | Type::Union(s)) = &ty else {
                return Err(BtfError::Missing(what()));
            };
            let (bit_offset, member_ty) =
                self.find_member(s, name)?.ok_or_else(|| BtfError::Missing(what()))?;
            if bit_offset % 8 != 0 {
                return Err(BtfError::Unaligned(what()));
            }
            offset += bit_offset / 8;
            ty = self.strip_modifiers(member_ty)?;
            if let Some(index) = index {
                let Type::Array(array) = &ty else {
                    return Err(BtfError::BadPath(what()));
                };
                if index >= array.len() {
                    return Err(BtfError::BadPath(what()));
                }
                let elem = self.strip_modifiers(self.btf.resolve_chained_type(array).map_err(parse_err)?)?;
                offset += (index * self.size_of(&elem)?) as u32;
                ty = elem;
            }
        }
        Ok(offset)
    }

    /// Size in bytes of `struct struct_name`.
    pub fn struct_size(&self, struct_name: &str) -> Result<u32, BtfError> {
        Ok(self.size_of(&self.named_struct(struct_name)?)? as u32)
    }

    /// Whether `struct struct_name` has a member at `path`.
    pub fn has_field(&self, struct_name: &str, path: &str) -> bool {
        self.offset_of(struct_name, path).is_ok()
    }

    /// Whether the kernel has a function `name` (a BTF FUNC: fentry can attach to it).
    pub fn has_function(&self, name: &str) -> bool {
        self.btf
            .resolve_types_by_name(name)
            .is_ok_and(|types| types.iter().any(|t| matches!(t, Type::Func(_))))
    }

    /// Enumerators of `enum enum_name` as (name, value).
    pub fn enum_values(&self, enum_name: &str) -> Result<Vec<(String, u64)>, BtfError> {
        for ty in self.btf.resolve_types_by_name(enum_name).map_err(parse_err)? {
            match ty {
                Type::Enum(e) if !e.members.is_empty() => {
                    return e
                        .members
                        .iter()
                        .map(|m| Ok((self.btf.resolve_name(m).map_err(parse_err)?, u64::from(m.val()))))
                        .collect();
                }
                Type::Enum64(e) if !e.members.is_empty() => {
                    return e
                        .members
                        .iter()
                        .map(|m| Ok((self.btf.resolve_name(m).map_err(parse_err)?, m.val())))
                        .collect();
                }
                _ => {}
            }
        }
        Err(BtfError::Missing(format!("enum {enum_name}")))
    }

    /// Number of arguments of tracepoint `name` (without the leading `void *__data`), from the
    /// `btf_trace_<name>` typedef that tp_btf programs attach through.
    pub fn tracepoint_arg_count(&self, name: &str) -> Result<usize, BtfError> {
        let typedef = format!("btf_trace_{name}");
        let missing = || BtfError::Missing(format!("tracepoint {name} ({typedef})"));
        let ty = self
            .btf
            .resolve_types_by_name(&typedef)
            .map_err(|_| missing())?
            .into_iter()
            .find(|t| matches!(t, Type::Typedef(_)))
            .ok_or_else(missing)?;
        let Type::Typedef(td) = ty else { return Err(missing()) };
        let Type::Ptr(ptr) = self.btf.resolve_chained_type(&td).map_err(parse_err)? else {
            return Err(missing());
        };
        let Type::FuncProto(proto) = self.btf.resolve_chained_type(&ptr).map_err(parse_err)? else {
            return Err(missing());
        };
        Ok(proto.parameters.len().saturating_sub(1))
    }

    fn named_struct(&self, name: &str) -> Result<Type, BtfError> {
        self.btf
            .resolve_types_by_name(name)
            .map_err(|_| BtfError::Missing(format!("struct {name}")))?
            .into_iter()
            .find(|t| matches!(t, Type::Struct(s) if !s.members.is_empty()))
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))
    }

    /// Finds `name` among the members of `s`, descending into anonymous members. Returns the
    /// member's bit offset from the start of `s` and its type.
    fn find_member(&self, s: &btf_rs::Struct, name: &str) -> Result<Option<(u32, Type)>, BtfError> {
        for member in &s.members {
            let member_name = self.btf.resolve_name(member).unwrap_or_default();
            let member_ty = self.btf.resolve_chained_type(member).map_err(parse_err)?;
            if member_name == name {
                return Ok(Some((member.bit_offset(), member_ty)));
            }
            if member_name.is_empty()
                && let Type::Struct(inner) | Type::Union(inner) = self.strip_modifiers(member_ty)?
                && let Some((bits, ty)) = self.find_member(&inner, name)?
            {
                return Ok(Some((member.bit_offset() + bits, ty)));
            }
        }
        Ok(None)
    }

    fn strip_modifiers(&self, mut ty: Type) -> Result<Type, BtfError> {
        loop {
            ty = match &ty {
                Type::Typedef(t) => self.btf.resolve_chained_type(t),
                Type::Const(t) | Type::Volatile(t) | Type::Restrict(t) => self.btf.resolve_chained_type(t),
                Type::TypeTag(t) => self.btf.resolve_chained_type(t),
                _ => return Ok(ty),
            }
            .map_err(parse_err)?;
        }
    }

    fn size_of(&self, ty: &Type) -> Result<usize, BtfError> {
        Ok(match ty {
            Type::Int(i) => i.size(),
            Type::Ptr(_) => 8,
            Type::Struct(s) | Type::Union(s) => s.size(),
            Type::Enum(e) => e.size(),
            Type::Enum64(e) => e.size(),
            Type::Float(f) => f.size(),
            Type::Array(a) => {
                let elem = self.strip_modifiers(self.btf.resolve_chained_type(a).map_err(parse_err)?)?;
                a.len() * self.size_of(&elem)?
            }
            other => return Err(BtfError::Parse(format!("no size for BTF {}", other.name()))),
        })
    }
}

/// `name` or `name[index]`.
fn parse_component(component: &str) -> Option<(&str, Option<usize>)> {
    match component.split_once('[') {
        None if !component.is_empty() => Some((component, None)),
        None => None,
        Some((name, rest)) => {
            let index = rest.strip_suffix(']')?.parse().ok()?;
            (!name.is_empty()).then_some((name, Some(index)))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// BTF dumps of real kernels, zstd compressed: Debian 6.1.0-57, Debian 6.12.117 (conntrack as
    /// a module) and 6.18.44 from the team's reference set (shared/kernels); Debian 5.10.0-46 and
    /// 7.3.4 from their packages' images and modules (agent/testdata/README.md).
    pub(crate) fn kernel(name: &str) -> KernelBtf {
        KernelBtf::from_bytes(&testdata(name, "vmlinux")).expect("parse vmlinux BTF")
    }

    pub(crate) fn testdata(kernel: &str, object: &str) -> Vec<u8> {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata/btf")
            .join(kernel)
            .join(format!("{object}.zst"));
        let compressed = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut out = Vec::new();
        let mut decoder = ruzstd::decoding::StreamingDecoder::new(compressed.as_slice()).expect("zstd");
        std::io::Read::read_to_end(&mut decoder, &mut out).expect("zstd decode");
        out
    }

    pub(crate) const KERNELS: [&str; 5] = ["5.10", "6.1", "6.12", "6.18", "7.3"];

    #[test]
    fn resolves_socket_offsets_on_every_kernel() {
        for k in KERNELS {
            let btf = kernel(k);
            // sock_common is the first member of struct sock on every kernel.
            assert_eq!(btf.offset_of("sock", "__sk_common").unwrap(), 0, "{k}");
            let dport = btf.offset_of("sock", "__sk_common.skc_dport").unwrap();
            let num = btf.offset_of("sock", "__sk_common.skc_num").unwrap();
            // skc_dport and skc_num share one 32-bit word (skc_portpair), dport first.
            assert_eq!(num, dport + 2, "{k}");
            assert!(btf.offset_of("sk_buff", "head").unwrap() > 0, "{k}");
        }
    }

    #[test]
    fn array_index_and_anonymous_members() {
        let btf = kernel("6.18");
        let t0 = btf.offset_of("nf_conn", "tuplehash[0].tuple.dst.u.all").unwrap();
        let t1 = btf.offset_of("nf_conn", "tuplehash[1].tuple.dst.u.all").unwrap();
        let hash_size = btf.offset_of("nf_conn", "tuplehash[1]").unwrap()
            - btf.offset_of("nf_conn", "tuplehash[0]").unwrap();
        assert_eq!(t1 - t0, hash_size);
        assert!(hash_size >= 40, "nf_conntrack_tuple_hash is at least 40 bytes, got {hash_size}");
        // `_nfct` sits in an anonymous union/struct of sk_buff.
        assert!(btf.has_field("sk_buff", "_nfct"));
    }

    #[test]
    fn missing_things_are_errors_not_guesses() {
        let btf = kernel("6.18");
        assert!(matches!(btf.offset_of("sock", "no_such_field"), Err(BtfError::Missing(_))));
        assert!(matches!(btf.offset_of("no_such_struct", "x"), Err(BtfError::Missing(_))));
        assert!(matches!(btf.offset_of("nf_conn", "tuplehash[2]"), Err(BtfError::BadPath(_))));
        assert!(matches!(btf.offset_of("sock", "a..b"), Err(BtfError::BadPath(_))));
        assert!(btf.tracepoint_arg_count("no_such_tracepoint").is_err());
        assert!(btf.enum_values("no_such_enum").is_err());
        assert!(KernelBtf::from_bytes(b"garbage").is_err());
    }

    #[test]
    fn tcp_send_reset_gained_its_reason_in_6_10() {
        assert_eq!(kernel("5.10").tracepoint_arg_count("tcp_send_reset").unwrap(), 2);
        assert_eq!(kernel("6.1").tracepoint_arg_count("tcp_send_reset").unwrap(), 2);
        assert_eq!(kernel("6.12").tracepoint_arg_count("tcp_send_reset").unwrap(), 3);
        assert_eq!(kernel("6.18").tracepoint_arg_count("tcp_send_reset").unwrap(), 3);
        assert_eq!(kernel("7.3").tracepoint_arg_count("tcp_send_reset").unwrap(), 3);
        for k in KERNELS {
            assert_eq!(kernel(k).tracepoint_arg_count("tcp_receive_reset").unwrap(), 1, "{k}");
        }
    }

    #[test]
    fn conntrack_module_btf_splits_on_vmlinux_and_agrees_with_it() {
        for k in ["6.1", "6.12"] {
            let vmlinux = kernel(k);
            let module = vmlinux.module_from_bytes(&testdata(k, "nf_conntrack")).unwrap();
            let path = "tuplehash[1].tuple.src.u.all";
            let from_module = module.offset_of("nf_conn", path).unwrap();
            // Some kernels also describe nf_conn in vmlinux; the layout must then be the same.
            if let Ok(from_vmlinux) = vmlinux.offset_of("nf_conn", path) {
                assert_eq!(from_vmlinux, from_module, "{k}");
            }
        }
    }

    #[test]
    fn enum_values_are_read_from_btf() {
        let values = kernel("6.1").enum_values("skb_drop_reason").unwrap();
        assert!(values.contains(&("SKB_DROP_REASON_NO_SOCKET".to_string(), 2)));
        let values = kernel("6.18").enum_values("sk_rst_reason").unwrap();
        assert!(values.contains(&("SK_RST_REASON_NO_SOCKET".to_string(), 1)));
    }
}
