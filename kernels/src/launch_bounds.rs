//! Launch bounds from kernel source: each entry point's most threads per block, so that both
//! backends refuse a launch the GPU would refuse. Shared with the build script, which reads
//! the bounds of the fixed kernels from their preprocessed text (this file has no dependencies
//! for that reason).

/// Finds `__launch_bounds__(N) entry(` in kernel source (numbers, or names `#define`d to
/// numbers in the same text): each entry's most threads per block. Generated kernels and the
/// build script's preprocessed fixed kernels both go through it.
pub(crate) fn launch_bounds_in(text: &str) -> Vec<(String, u32)> {
    let defines: std::collections::HashMap<&str, u32> = text
        .lines()
        .filter_map(|l| {
            let mut w = l.trim_start().strip_prefix("#define")?.split_whitespace();
            let name = w.next()?;
            let value = w.next()?.trim_end_matches(['u', 'U']).parse().ok()?;
            w.next().is_none().then_some((name, value))
        })
        .collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = Vec::new();
    for marker in ["__launch_bounds__(", "spate_emu_bounds_mark("] {
        let mut rest = text;
        while let Some(at) = rest.find(marker) {
            rest = &rest[at + marker.len()..];
            let Some(close) = rest.find(')') else { break };
            let first = rest[..close].split(',').next().unwrap_or("").trim();
            let bound = first
                .trim_end_matches(['u', 'U'])
                .parse::<u32>()
                .ok()
                .or_else(|| defines.get(first).copied());
            let after = rest[close + 1..].trim_start();
            let name: String = after.chars().take_while(|c| ident(*c)).collect();
            let called = after[name.len()..].trim_start().starts_with('(');
            if let (Some(bound), true, false) = (bound, called, name.is_empty()) {
                out.push((name, bound));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::launch_bounds_in;

    #[test]
    fn launch_bounds_are_found_with_literals_and_defines() {
        let text = "#define SPATE_BLOCK_THREADS 256\n\
            extern \"C\" __global__ void __launch_bounds__(SPATE_BLOCK_THREADS) f_a(int x) {}\n\
            extern \"C\" __global__ void __launch_bounds__(128, 2) g(int x) {}\n\
            extern \"C\" __global__ void h(int x) {}\n\
            void spate_emu_bounds_mark(512) k_u32 (int) {}\n";
        assert_eq!(
            launch_bounds_in(text),
            vec![
                ("f_a".to_string(), 256),
                ("g".to_string(), 128),
                ("k_u32".to_string(), 512)
            ]
        );
    }
}
