# Example: a read-only reviewer. An agent that reviews code may run small
# analysis scripts and the repository's linters, but never change the
# repository, reach the network, or see confine's environment.
#
# The policy is one half; mount the workspace read-only in confine.toml:
#
#   [sandbox]
#   workspace_rw = false
#
#   [policy]
#   mode = "all"           # the built-in policy still applies...
#   [[policy.evaluators]]  # ...and this one narrows it
#   path = "/etc/confine/policies/reviewer-readonly.rego"
package confine

# Interpreted languages only: nothing that compiles into the workspace.
review_runtimes := {"python", "node", "typescript", "shell", "ruby", "perl"}

# Arguments that ask a tool to write: formatters in fix mode and the like.
writing_flags := {"--fix", "--write", "-w", "-i", "--in-place", "--apply"}

default allow := false

allow if count(deny_reasons) == 0

deny_reasons contains msg if {
	not review_runtimes[input.runtime]
	msg := sprintf("the reviewer may not use runtime '%s'", [input.runtime])
}

deny_reasons contains msg if {
	some arg in input.args
	writing_flags[arg]
	msg := sprintf("'%s' would modify the repository", [arg])
}

deny_reasons contains "the reviewer may not pass environment variables" if {
	count(input.env_keys) > 0
}

deny_reasons contains "network is not allowed for the reviewer" if {
	input.network.mode != "none"
}

# Inline scripts are for looking, not for building: keep them small.
deny_reasons contains "review scripts are limited to 64 KiB" if {
	input.code_bytes > 65536
}

limits := {"timeoutMs": 60000, "memoryBytes": 536870912, "cpus": 1, "pids": 64}
