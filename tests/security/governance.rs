//! Classes that cross the governed pipeline and the MCP server: executables
//! and `#!` lines (2), sessions and repositories kept apart (10), HTTP
//! tokens (11), and what the policy sees (12).
