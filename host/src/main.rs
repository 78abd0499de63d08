//! The `wtune` binary; everything lives in the library.

fn main() -> std::process::ExitCode {
    wtune::cli::main()
}
