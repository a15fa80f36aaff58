//! The machine architectures kstall ships for: this machine's (amd64) and arm64, cross-built.

use std::process::Command;

use anyhow::Context as _;

use crate::bootstrap;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Amd64,
    Arm64,
}

/// `--arch`'s values: one architecture or every one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Arches {
    Amd64,
    Arm64,
    All,
}

impl Arches {
    pub fn list(self) -> Vec<Arch> {
        match self {
            Arches::Amd64 => vec![Arch::Amd64],
            Arches::Arm64 => vec![Arch::Arm64],
            Arches::All => Arch::ALL.to_vec(),
        }
    }
}

impl Arch {
    pub const ALL: [Arch; 2] = [Arch::Amd64, Arch::Arm64];

    /// Debian's and the OCI image platform's name (also virtme-ng's `--arch`).
    pub fn name(self) -> &'static str {
        match self {
            Arch::Amd64 => "amd64",
            Arch::Arm64 => "arm64",
        }
    }

    /// The build machine's; everything else is cross-built.
    pub fn is_host(self) -> bool {
        self == Arch::Amd64
    }

    pub fn rust_target(self) -> &'static str {
        match self {
            Arch::Amd64 => "x86_64-unknown-linux-gnu",
            Arch::Arm64 => "aarch64-unknown-linux-gnu",
        }
    }

    /// A binutils tool that works on this architecture's binaries (Debian's cross binutils come
    /// with its cross gcc).
    pub fn binutil(self, tool: &str) -> String {
        match self {
            Arch::Amd64 => tool.to_string(),
            Arch::Arm64 => format!("aarch64-linux-gnu-{tool}"),
        }
    }

    /// `readelf -h`'s name of the ELF machine.
    pub fn elf_machine(self) -> &'static str {
        match self {
            Arch::Amd64 => "Advanced Micro Devices X86-64",
            Arch::Arm64 => "AArch64",
        }
    }

    /// Where the C libraries the binary links are found here, and where they go in an image.
    /// arm64's come from Debian's cross packages (libc6-arm64-cross: libc6:arm64's files).
    pub fn libraries(self) -> LibraryDirs {
        match self {
            Arch::Amd64 => LibraryDirs { here: "/lib/x86_64-linux-gnu", in_image: "/lib/x86_64-linux-gnu" },
            Arch::Arm64 => {
                LibraryDirs { here: "/usr/aarch64-linux-gnu/lib", in_image: "/lib/aarch64-linux-gnu" }
            }
        }
    }

    /// Installs the cross toolchain: the Rust target, Debian's cross gcc (the linker, named in
    /// .cargo/config.toml) and the target's C library.
    pub fn bootstrap(self) -> anyhow::Result<()> {
        if self.is_host() {
            return Ok(());
        }
        bootstrap::apt_install(&["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross"])?;
        let installed = Command::new("rustup")
            .args(["target", "list", "--installed"])
            .output()
            .context("bootstrap: cannot run rustup")?;
        if !String::from_utf8_lossy(&installed.stdout).lines().any(|t| t == self.rust_target()) {
            println!("bootstrap: adding the Rust target {}", self.rust_target());
            bootstrap::run_step(
                Command::new("rustup").args(["target", "add", self.rust_target()]),
                "rustup target add",
            )?;
        }
        Ok(())
    }
}

pub struct LibraryDirs {
    pub here: &'static str,
    pub in_image: &'static str,
}
