#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| confine::fuzz::mcp_tool_args(data));
