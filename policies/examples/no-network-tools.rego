# Example: no network tools, wherever they are named. The built-in policy
# refuses `curl` as the executable of a request; this one also reads the
# request's inline code and its arguments, so `sh -c 'curl …'` and a
# script that calls wget are refused too.
#
# It adds to the built-in policy (mode "all"):
#
#   [[policy.evaluators]]
#   path = "/etc/confine/policies/no-network-tools.rego"
#
# A policy gates requests, it does not contain them: code can build the
# name at run time ("cu" + "rl"), download with python's urllib, or open a
# socket itself. The sandbox's network namespace is what keeps a job off
# the network; a rule like this one refuses the obvious attempts early,
# with a reason the caller can read.
package confine

network_tools := {"curl", "wget", "nc", "ncat", "netcat", "socat", "telnet", "ftp", "ssh", "scp", "sftp"}

# One pattern for all of them, so the code is scanned once. A tool's name
# counts as a word: not part of a longer name ("curling"), but after a
# path ("/usr/bin/curl") or inside quotes ("['curl', …]").
pattern := sprintf("(?:^|[^A-Za-z0-9_.-])(%s)(?:[^A-Za-z0-9_-]|$)", [concat("|", sort(network_tools))])

# The tools a text names.
named(text) := {m[1] | some m in regex.find_all_string_submatch_n(pattern, text, -1)}

default allow := false

allow if count(deny_reasons) == 0

deny_reasons contains msg if {
	is_string(input.code)
	some tool in named(input.code)
	msg := sprintf("network tools are not allowed: the code runs '%s'", [tool])
}

deny_reasons contains msg if {
	some arg in input.args
	some tool in named(arg)
	msg := sprintf("network tools are not allowed: an argument runs '%s'", [tool])
}

# input.code holds the first 64 KiB; this policy never saw the rest.
deny_reasons contains "code over 64 KiB can't be checked for network tools; send a smaller script" if {
	input.code_truncated
}
