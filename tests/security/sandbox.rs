//! Classes of the sandbox itself and of `confine run`: paths the
//! supervisor writes (1), host ids (3), planted code and setuid bits (4),
//! default limits (5), kernel counters (6), session and terminal (7),
//! inherited attributes (8), `/proc` and syscalls (9), and the posture test.
