# Example: a CI runner that may run only the repository's test commands.
#
# Use it instead of the built-in policy:
#
#   [policy]
#   builtin = false
#   [[policy.evaluators]]
#   path = "/etc/confine/policies/ci-runner.rego"
#
#   # Optional: the commands this CI may run, as argv prefixes.
#   [policy.data]
#   test_commands = [["cargo", "test"], ["npm", "test"], ["pytest"]]
#
# Inline code (code mode) is refused: a CI job runs what is in the
# repository, not what an agent writes on the fly.
package confine

# Used when [policy.data] names no test_commands. Each entry is the
# executable's name followed by the leading arguments it must be given.
default_test_commands := [
	["cargo", "test"],
	["go", "test"],
	["npm", "test"],
	["npx", "jest"],
	["pytest"],
	["python3", "-m", "pytest"],
	["bash", "./ci/test.sh"],
]

test_commands := data.confine_data.test_commands if {
	data.confine_data.test_commands
} else := default_test_commands

command_parts := split(input.command, "/")

argv := array.concat([command_parts[count(command_parts) - 1]], input.args)

# argv starts with one of the allowed prefixes.
is_test_command if {
	some prefix in test_commands
	count(argv) >= count(prefix)
	array.slice(argv, 0, count(prefix)) == prefix
}

default allow := false

allow if count(deny_reasons) == 0

deny_reasons contains "inline code is not allowed on the CI runner" if {
	input.operation == "execute_code"
}

deny_reasons contains msg if {
	input.operation == "execute_args"
	not is_test_command
	msg := sprintf("only the repository's test commands may run (got '%s')", [concat(" ", argv)])
}

deny_reasons contains "network is not allowed on the CI runner" if {
	input.network.mode != "none"
}

deny_reasons contains "a repository is required (name a repoId)" if {
	input.repoId == null
}

# Test suites may take long, but not forever, and never the whole machine.
limits := {"timeoutMs": 900000, "memoryBytes": 4294967296, "pids": 1024}
