# confine's built-in policy (embedded in the binary).
#
# It answers three things, as every confine policy does:
#   allow         true when the request may run
#   deny_reasons  a set of strings, each a reason to refuse (shown to the caller)
#   limits        optional caps: {"timeoutMs", "memoryBytes", "cpus", "pids", "outputBytes"}
#
# input: {operation, runtime, command, args, cwd, env_keys, timeoutMs, limits,
#         network, repoId, code, code_truncated, code_sha256, code_bytes}
#   network: {mode: "none"|"host"|"allow", allow: [entries]}, the entries
#   with confine.toml's @lists expanded, normalized (lowercase, no
#   trailing dot; "host:port", "*.suffix", "+nosni").
#   code: the inline code's first 64 KiB (null in args mode); code_truncated:
#   true when there was more; code_bytes and code_sha256 cover all of it.
#   policies/examples/no-network-tools.rego reads code and args.
# data.confine_config: {allow_host_network, network_allowlisted (every entry
# of confine.toml's [network.allow] lists)}; data.confine_data: [policy.data]
#
# What it allows: the 16 runtimes, inside a configured repository, with no
# network. --net host only when policy.allow_host_network = true; an
# allowlisted network only with entries of the operator's [network.allow]
# lists (a client can't widen it to a host of its own choosing).
package confine

runtimes := {
	"node", "typescript", "python", "shell", "go", "java", "kotlin", "rust",
	"c", "cpp", "csharp", "ruby", "php", "perl", "r", "elixir",
}

# Programs whose whole purpose is to talk to the network. As the executable
# of a request they are refused even with host networking.
network_tools := {
	"curl", "wget", "nc", "ncat", "netcat", "socat", "telnet", "ftp",
	"ssh", "scp", "sftp", "rsync",
}

default allow := false

allow if count(deny_reasons) == 0

command_parts := split(input.command, "/")

command_name := command_parts[count(command_parts) - 1]

deny_reasons contains msg if {
	not runtimes[input.runtime]
	msg := sprintf("runtime '%s' is not supported", [input.runtime])
}

deny_reasons contains msg if {
	network_tools[command_name]
	msg := sprintf("'%s' is a network tool, and network tools are not allowed", [command_name])
}

deny_reasons contains "host networking is not allowed (set policy.allow_host_network = true)" if {
	input.network.mode == "host"
	not data.confine_config.allow_host_network
}

allowlisted contains entry if {
	some entry in data.confine_config.network_allowlisted
}

deny_reasons contains msg if {
	input.network.mode == "allow"
	some entry in input.network.allow
	not allowlisted[entry]
	msg := sprintf("network allowlist entry '%s' is not in confine.toml's [network.allow] lists", [entry])
}

deny_reasons contains "a repository is required (name a repoId)" if {
	input.repoId == null
}

deny_reasons contains msg if {
	startswith(input.cwd, "/")
	msg := sprintf("relativeCwd must be relative to the repository root (got '%s')", [input.cwd])
}

deny_reasons contains msg if {
	some part in split(input.cwd, "/")
	part == ".."
	msg := sprintf("relativeCwd must not contain '..' (got '%s')", [input.cwd])
}
