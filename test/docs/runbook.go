package docs

import (
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"
)

// Command is one command of a runbook: a line of a ```sh block of docs/metrics.md.
type Command struct {
	// Section is the heading of the section it is in: the alert, for a runbook.
	Section string
	// Line is its line in the page, from 1.
	Line int
	// Text is the command as written, placeholders and all.
	Text string
}

func (c Command) String() string {
	return fmt.Sprintf("docs/metrics.md:%d (%s): %s", c.Line, c.Section, c.Text)
}

// ReadOnlyVerbs are the kubectl commands a runbook may use: they only read.
var ReadOnlyVerbs = map[string]bool{"get": true, "describe": true}

// refusedFlags are kubectl flags a runbook's command must not carry: those that choose
// another cluster or identity than the reader's kubeconfig (a test runs the commands
// against its own control plane), and those that wait for changes instead of ending.
var refusedFlags = []string{"--kubeconfig", "--context", "--cluster", "--server", "-s", "--user", "--token",
	"--as", "--as-group", "--as-uid", "--username", "--password", "--certificate-authority", "--client-certificate",
	"--client-key", "--insecure-skip-tls-verify", "--tls-server-name", "--watch", "-w", "--watch-only"}

// placeholderRE is a placeholder of a command: <pool>, <pool_namespace>, ...
var placeholderRE = regexp.MustCompile(`^<([a-z][a-z_]*)>`)

// kubectlSpan is a code span that is a kubectl command; spanRE any code span.
var (
	kubectlSpan = regexp.MustCompile("`kubectl\\b[^`]*`")
	spanRE      = regexp.MustCompile("`([^`]+)`")
)

// RunbookCommands returns the commands of page, the text of docs/metrics.md: every line of
// its ```sh blocks but blank lines and # comments. It is strict, so that no command is
// left out of what runs them: it reports a fenced block of another language or of none,
// one left open, a line continued with a backslash, a command that Args cannot read
// (placeholders are not checked here), and a code span outside the blocks that is a
// kubectl command or, in an alert's section (### under ## Alerts), any other command: a
// span with a space in it that names no vitistack_ipam_ metric (PromQL names one).
func RunbookCommands(page string) ([]Command, []string) {
	var cmds []Command
	var problems []string
	section, inAlerts, inFence, fenceLine, lang := "", false, false, 0, ""
	for i, line := range strings.Split(page, "\n") {
		n, trimmed := i+1, strings.TrimSpace(line)
		if strings.HasPrefix(trimmed, "```") || strings.HasPrefix(trimmed, "~~~") {
			if inFence {
				inFence = false
				continue
			}
			inFence, fenceLine, lang = true, n, strings.TrimSpace(trimmed[3:])
			if lang != "sh" {
				problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: a code block of language %q: the page's only code "+
					"blocks are ```sh blocks of commands, which a test runs", n, lang))
			}
			continue
		}
		if inFence {
			if lang != "sh" || trimmed == "" || strings.HasPrefix(trimmed, "#") {
				continue
			}
			c := Command{Section: section, Line: n, Text: trimmed}
			if strings.HasSuffix(trimmed, `\`) {
				problems = append(problems, fmt.Sprintf("%s: continued on the next line: write each command on one line", c))
				continue
			}
			if _, err := c.Args(c.asWritten()); err != nil {
				problems = append(problems, fmt.Sprintf("%s: %v", c, err))
			}
			cmds = append(cmds, c)
			continue
		}
		switch {
		case strings.HasPrefix(line, "## "):
			section, inAlerts = strings.TrimSpace(line[3:]), strings.TrimSpace(line[3:]) == "Alerts"
		case strings.HasPrefix(line, "### "):
			section = strings.TrimSpace(line[4:])
		}
		for _, span := range kubectlSpan.FindAllString(line, -1) {
			problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: %s is a command outside a ```sh block: move it into one, "+
				"where a test runs it", n, span))
		}
		if inAlerts && section != "Alerts" {
			for _, m := range spanRE.FindAllStringSubmatch(line, -1) {
				if span := m[1]; strings.Contains(span, " ") && !strings.Contains(span, "vitistack_ipam_") && !strings.HasPrefix(span, "kubectl") {
					problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: `%s` in the runbook %s looks like a command: "+
						"move it into a ```sh block, where a test runs it, or name a metric of the provider if it is PromQL", n, span, section))
				}
			}
		}
	}
	if inFence {
		problems = append(problems, fmt.Sprintf("docs/metrics.md:%d: a code block that is never closed", fenceLine))
	}
	return cmds, problems
}

// Args splits the command into its words, as sh would, with each placeholder (<name>)
// replaced by values[name]; a placeholder values lacks is an error. It reads only what a
// runbook needs, and refuses the rest: the command must be kubectl with a verb of
// ReadOnlyVerbs and none of refusedFlags; quotes may be single or double (no escapes in
// them but \" and \\); outside quotes, any character the shell would expand or treat
// specially (a pipe, a redirection, $, a glob, a backslash...) is an error.
func (c Command) Args(values map[string]string) ([]string, error) {
	var words []string
	var word strings.Builder
	inWord := false
	var quote rune
	text := []rune(c.Text)
	for i := 0; i < len(text); i++ {
		r := text[i]
		if r == '<' {
			if m := placeholderRE.FindStringSubmatch(string(text[i:])); m != nil {
				v, ok := values[m[1]]
				if !ok {
					return nil, fmt.Errorf("unknown placeholder %s", m[0])
				}
				word.WriteString(v)
				inWord = true
				i += len([]rune(m[0])) - 1
				continue
			}
		}
		switch {
		case quote == '\'':
			if r == '\'' {
				quote = 0
				continue
			}
			word.WriteRune(r)
		case quote == '"':
			switch {
			case r == '"':
				quote = 0
			case r == '\\' && i+1 < len(text) && (text[i+1] == '"' || text[i+1] == '\\'):
				i++
				word.WriteRune(text[i])
			case r == '$' || r == '`' || r == '\\':
				return nil, fmt.Errorf("%q in double quotes: the shell would expand it", r)
			default:
				word.WriteRune(r)
			}
		case r == '\'' || r == '"':
			quote, inWord = r, true
		case r == ' ' || r == '\t':
			if inWord {
				words = append(words, word.String())
				word.Reset()
				inWord = false
			}
		case strings.ContainsRune("|&;<>()$`\\*?[]{}~#!", r):
			return nil, fmt.Errorf("%q outside quotes: the shell would treat it specially", r)
		default:
			word.WriteRune(r)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("a quote (%c) that is never closed", quote)
	}
	if inWord {
		words = append(words, word.String())
	}
	if len(words) < 3 || words[0] != "kubectl" || !ReadOnlyVerbs[words[1]] {
		return nil, fmt.Errorf("not kubectl with a verb that only reads (%s) and a resource", strings.Join(slices.Sorted(maps.Keys(ReadOnlyVerbs)), ", "))
	}
	for _, w := range words[2:] {
		for _, f := range refusedFlags {
			if w == f || strings.HasPrefix(w, f+"=") {
				return nil, fmt.Errorf("the flag %s: a runbook's command uses the reader's kubeconfig as it is, and ends", f)
			}
		}
	}
	return words, nil
}

// Placeholders are the placeholders of the command, without their angle brackets.
func (c Command) Placeholders() []string {
	var names []string
	for i := range c.Text {
		if m := placeholderRE.FindStringSubmatch(c.Text[i:]); m != nil {
			names = append(names, m[1])
		}
	}
	return names
}

// asWritten fills each placeholder with itself: what Args reads, placeholders aside.
func (c Command) asWritten() map[string]string {
	values := map[string]string{}
	for _, p := range c.Placeholders() {
		values[p] = "<" + p + ">"
	}
	return values
}
