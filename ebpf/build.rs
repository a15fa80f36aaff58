//! Building this crate needs `bpf-linker` on PATH, which cargo cannot express as a dependency:
//! rebuild when it changes (aya-template's approach).
fn main() {
    match which::which("bpf-linker") {
        Ok(path) => println!("cargo:rerun-if-changed={}", path.display()),
        Err(e) => println!("cargo:warning=bpf-linker not found ({e}); run `cargo xtask bootstrap`"),
    }
}
