package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stockade-sh/stockade/internal/testenv"
)

// The README's code blocks follow these conventions, which TestReadme
// reads, so that every example works as written, in order, from a fresh
// shell:
//
//   - A ```sh block holds commands: they run, in the order of the README,
//     as one shell session. A command is a line, with the lines it
//     continues with a backslash; blank and comment lines are not
//     commands.
//   - A block of another language (```yaml, ```json) is data. The line
//     before it ends with "Saved as `FILE`:", and the session saves it to
//     FILE (relative to the home directory, where the session runs) when
//     it reaches it.
//   - A ```text block is shown as it is: a listing, never run.
//   - A block that must be shown but cannot be run or saved has a marker
//     on the line before it, `<!-- readme-test: not run: REASON -->`, or,
//     for a synopsis of commands with placeholders,
//     `<!-- readme-test: synopsis: REASON -->`: TestReadmeSynopsis checks
//     that each of its commands takes the flags it names.
//
// A block without a language, a data block without a file to go to and a
// marker not right before a block fail the test: nothing is skipped
// silently.

// readmeFile lets the test run on another copy of the README, to see it
// fail on a broken one: go test ./cmd/stockade -run TestReadme -args -readme FILE.
var readmeFile = flag.String("readme", "", "the README whose code blocks TestReadme runs (default: the module's README.md)")

// readmeBlock is a fenced code block of the README.
type readmeBlock struct {
	line    int    // of the opening fence, from 1
	section string // the heading above it, as written
	lang    string // the fence's info string
	body    string // its lines, each ending in a newline
	savedAs string // the file a data block is saved as
	marker  string // "not run" or "synopsis", from its readme-test marker
	reason  string // the marker's reason
}

func (b readmeBlock) String() string {
	return fmt.Sprintf("the ```%s block at README line %d (%s)", b.lang, b.line, b.section)
}

var (
	fenceRe   = regexp.MustCompile("^```(\\S*)\\s*$")
	markerRe  = regexp.MustCompile(`^<!-- readme-test: (not run|synopsis): (\S.*) -->$`)
	savedAsRe = regexp.MustCompile("[Ss]aved as `([^`]+)`:$")
)

// parseReadme returns the README's code blocks, classified by the
// conventions above, or the first place where it breaks them.
func parseReadme(text string) ([]readmeBlock, error) {
	lines := strings.Split(text, "\n")
	var (
		blocks     []readmeBlock
		section    = "the top"
		prev       string // the last non-blank line outside blocks
		markerLine int    // of a marker waiting for its block, or 0
	)
	for i := 0; i < len(lines); i++ {
		l := strings.TrimRight(lines[i], " \t")
		m := fenceRe.FindStringSubmatch(l)
		if m == nil {
			if l == "" {
				continue
			}
			if markerLine != 0 {
				return nil, fmt.Errorf("README line %d: the readme-test marker is not right before a code block", markerLine)
			}
			switch {
			case strings.HasPrefix(l, "<!-- readme-test"):
				if !markerRe.MatchString(l) {
					return nil, fmt.Errorf("README line %d: %q is not `<!-- readme-test: not run|synopsis: REASON -->`", i+1, l)
				}
				markerLine = i + 1
			case strings.HasPrefix(l, "#"):
				section = l
			}
			prev = l
			continue
		}
		b := readmeBlock{line: i + 1, section: section, lang: m[1]}
		end := i + 1
		for end < len(lines) && strings.TrimRight(lines[end], " \t") != "```" {
			end++
		}
		if end == len(lines) {
			return nil, fmt.Errorf("%s is not closed", b)
		}
		for _, bl := range lines[i+1 : end] {
			b.body += bl + "\n"
		}
		i = end
		if mm := markerRe.FindStringSubmatch(prev); mm != nil {
			b.marker, b.reason = mm[1], mm[2]
		} else if sm := savedAsRe.FindStringSubmatch(prev); sm != nil {
			b.savedAs = sm[1]
		}
		prev, markerLine = "", 0
		switch {
		case b.lang == "":
			return nil, fmt.Errorf("%s has no language: make it sh (run), text (shown as it is), or the data's language with the file it is saved as", b)
		case b.marker == "synopsis" && b.lang != "sh":
			return nil, fmt.Errorf("%s: a synopsis is a ```sh block", b)
		case b.lang != "sh" && b.lang != "text" && b.marker == "" && b.savedAs == "":
			return nil, fmt.Errorf("%s is data that is saved nowhere: end the line before it with \"Saved as `FILE`:\", or mark it <!-- readme-test: not run: REASON -->", b)
		}
		blocks = append(blocks, b)
	}
	if markerLine != 0 {
		return nil, fmt.Errorf("README line %d: the readme-test marker is not right before a code block", markerLine)
	}
	return blocks, nil
}

// readmeCommand is a command of a ```sh block.
type readmeCommand struct {
	line int    // README line of its first line
	text string // as written, continuation lines included
	bare string // without comments, on one line, spaces collapsed
}

// commands splits a ```sh block into its commands.
func (b readmeBlock) commands() []readmeCommand {
	lines := strings.Split(strings.TrimSuffix(b.body, "\n"), "\n")
	var cmds []readmeCommand
	for i := 0; i < len(lines); i++ {
		if t := strings.TrimSpace(lines[i]); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		start := i
		for i+1 < len(lines) && strings.HasSuffix(strings.TrimRight(lines[i], " \t"), `\`) {
			i++
		}
		text := strings.Join(lines[start:i+1], "\n")
		cmds = append(cmds, readmeCommand{line: b.line + 1 + start, text: text, bare: bareCommand(text)})
	}
	return cmds
}

// bareCommand is a command without its comments and continuation
// backslashes, its words separated by one space: what the test's tables
// name commands by.
func bareCommand(text string) string {
	var lines []string
	for _, l := range strings.Split(text, "\n") {
		l = stripComment(l)
		lines = append(lines, strings.TrimSuffix(strings.TrimRight(l, " \t"), `\`))
	}
	return strings.Join(strings.Fields(strings.Join(lines, " ")), " ")
}

// stripComment cuts a shell comment off a line: a # that begins a word
// outside quotes, and what follows it.
func stripComment(l string) string {
	inSingle, inDouble := false, false
	for i := 0; i < len(l); i++ {
		switch c := l[i]; {
		case inSingle:
			inSingle = c != '\''
		case c == '\\':
			i++
		case inDouble:
			inDouble = c != '"'
		case c == '\'':
			inSingle = true
		case c == '"':
			inDouble = true
		case c == '#' && (i == 0 || l[i-1] == ' ' || l[i-1] == '\t'):
			return l[:i]
		}
	}
	return l
}

// readmeStandins are the README's commands that the test cannot run as
// written, each with what it runs instead (nothing: not run) and why. Every
// entry must match a command of the README, so the list cannot outlive
// what it stands in for.
var readmeStandins = map[string]struct{ run, why string }{
	"make up": {
		run: "stockade setup\n/run/readme/up.sh",
		why: "make up is make setup (build, install to /usr/local/bin, stockade setup) then scripts/up.sh; " +
			"the test has built this tree's stockade and put it first on PATH, so it runs stockade setup " +
			"(the images are there: it builds none) and scripts/up.sh, which shows code running on both tiers " +
			"and starts the daemon on the defaults",
	},
	"make test": {
		why: "this test is part of make test, which would run it again",
	},
}

// readmeChecks are what the README says its commands print, by command.
// Each entry must match a command of the README. A command's output is
// its stdout and stderr together, in the order written.
var readmeChecks = map[string]func(out string) error{
	"make up": func(out string) error {
		for _, re := range []string{`(?m)^gvisor +pandas \d+\.\d+\.\d+$`, `(?m)^runc +pandas \d+\.\d+\.\d+$`, `(?m)^stockade serving on http://127\.0\.0\.1:8700 `} {
			if !regexp.MustCompile(re).MatchString(out) {
				return fmt.Errorf("want a line matching %s (pandas' version on both tiers, then the daemon on the default address)", re)
			}
		}
		return nil
	},
	`stockade run --runtime python -c 'import pandas; print(pandas.__version__)'`: matches(`^\d+\.\d+\.\d+\n$`),
	`stockade run --runtime node --driver runc -c 'console.log(6*7)'`:             matches(`^42\n$`),
	`echo 'echo hello from $(uname -s)' | stockade run --runtime shell -`:         matches(`^hello from Linux\n$`),
	"seq 1 100 | stockade run --runtime python --timeout 5s --memory 256MiB --json /tmp/script.py": jsonFields(map[string]any{
		"status": "succeeded", "exit_code": 0.0, "stdout": "5050\n", "stderr": "", "runtime": "python",
	}),
	// "the answer is 202 with the approval card an approver sees"
	`curl -s -X POST http://127.0.0.1:8700/v1/executions -H "Authorization: Bearer $AGENT" -d '{"runtime":"python","code":"print(6*7)"}' | tee /tmp/stockade-exec.json`: jsonFields(map[string]any{
		"status": "awaiting_approval", "approval.code": "print(6*7)",
	}),
	`curl -s "http://127.0.0.1:8700/v1/approvals?status=pending" -H "Authorization: Bearer $APPROVER"`: jsonFields(map[string]any{
		"items.0.status": "pending", "items.0.card.code": "print(6*7)",
	}),
	`curl -s -X POST "http://127.0.0.1:8700/v1/approvals/$APPROVAL/approve" -H "Authorization: Bearer $APPROVER"`: jsonFields(map[string]any{
		"approval.status": "approved",
	}),
	`curl -s "http://127.0.0.1:8700/v1/executions/$EXEC?wait=30s" -H "Authorization: Bearer $AGENT"`: jsonFields(map[string]any{
		"status": "succeeded", "result.exit_code": 0.0, "result.stdout": "42\n",
	}),
	// "then the balance: 98"
	`curl -s http://127.0.0.1:8700/v1/workspace -H "Authorization: Bearer $AGENT"`: jsonFields(map[string]any{
		"credits.available": 98.0, "credits.reserved": 0.0,
	}),
	"wait $RUN && cat /tmp/stockade-run.out":                                 matches(`^42\n$`),
	"stockade tools lint tools.yaml":                                         matches(`^ok: 1 tool\n$`),
	"stockade tools record sales-report --tools tools.yaml":                  matches("(?m)^# Tool `sales-report`$"),
	"stockade tools list --tools tools.yaml":                                 matches(`(?m)^sales-report +trusted +container `),
	"stockade audit verify":                                                  matches(`(?m)^workspace demo \(ws_\w+\): ok `),
	"stockade template lint --templates templates.yaml --tools analyst.yaml": matches(`^ok: 1 template\n$`),
	"stockade template build analytics --templates templates.yaml": matches(
		`(?s)analytics: hashing.*\nanalytics: sha256:[0-9a-f]{64}  [0-9.]+ MiB  \(built in [^)]+\)\nanalytics: 0 Debian packages, 0 wheels, 0 npm packages, 1 file\n`),
	"stockade template show analytics --templates templates.yaml": matches(`(?m)^file +/opt/rates\.json +- +sha256:[0-9a-f]{64}$`),
	`stockade run --templates templates.yaml --tools analyst.yaml --tool analyst --runtime python -c 'import os; print(open(os.environ["RATES"]).read().strip())'`: matches(`^\{"eur": 0\.92, "usd": 1\.0\}\n$`),
	"stockade template list":            matches(`(?m)^analytics +python +current +sha256:`),
	"stockade template build analytics": matches(`(?m)^analytics: sha256:[0-9a-f]{64} .*\(unchanged: a cache hit\)$`),
	`stockade session exec "$SES" --code 'print(rates["eur"] * 100, sympy.sqrt(2).evalf(3))'`: matches(`^92\.0 1\.41\n$`),
}

// matches checks that the output matches a regular expression.
func matches(re string) func(string) error {
	r := regexp.MustCompile(re)
	return func(out string) error {
		if !r.MatchString(out) {
			return fmt.Errorf("want output matching %s", re)
		}
		return nil
	}
}

// jsonFields checks that the output is a JSON object with these fields,
// named by their path ("result.stdout", "items.0.status"), numbers as
// float64.
func jsonFields(want map[string]any) func(string) error {
	return func(out string) error {
		var obj any
		if err := json.Unmarshal([]byte(out), &obj); err != nil {
			return fmt.Errorf("want a JSON object: %v", err)
		}
		for path, v := range want {
			got := obj
			for _, k := range strings.Split(path, ".") {
				switch v := got.(type) {
				case map[string]any:
					got = v[k]
				case []any:
					i, err := strconv.Atoi(k)
					if err != nil || i >= len(v) {
						got = nil
						break
					}
					got = v[i]
				default:
					got = nil
				}
			}
			if got != v {
				return fmt.Errorf("field %s: got %#v, want %#v", path, got, v)
			}
		}
		return nil
	}
}

// readmeStep is what the session runs for one command or data block.
type readmeStep struct {
	block readmeBlock
	line  int    // README line of the command, or of the data block
	shown string // the command as written, or what saving the block does
	bare  string // the command's name in readmeStandins and readmeChecks
	run   string // the shell text the session runs
}

// readmeSession turns the blocks into the steps of the session, replacing
// the commands of readmeStandins. It returns what it does not run, with
// the reasons, for the log.
func readmeSession(blocks []readmeBlock) (steps []readmeStep, notRun []string, err error) {
	used := map[string]bool{}
	for _, b := range blocks {
		switch {
		case b.lang == "text":
			continue
		case b.marker != "":
			notRun = append(notRun, fmt.Sprintf("%s: %s: %s", b, b.marker, b.reason))
		case b.lang == "sh":
			for _, c := range b.commands() {
				s := readmeStep{block: b, line: c.line, shown: c.text, bare: c.bare, run: c.text}
				if sub, ok := readmeStandins[c.bare]; ok {
					used[c.bare] = true
					if sub.run == "" {
						notRun = append(notRun, fmt.Sprintf("README line %d: %s: not run: %s", c.line, c.bare, sub.why))
						continue
					}
					s.shown += "\n# stood in for by: " + strings.ReplaceAll(sub.run, "\n", "; ")
					s.run = sub.run
				}
				steps = append(steps, s)
			}
		default:
			delim := "README_EOF"
			for strings.Contains(b.body, delim) {
				delim += "_"
			}
			steps = append(steps, readmeStep{block: b, line: b.line, shown: "save the block as " + b.savedAs,
				run: fmt.Sprintf("cat > %s <<'%s'\n%s%s", shellQuote(b.savedAs), delim, b.body, delim)})
		}
	}
	for c := range readmeStandins {
		if !used[c] {
			return nil, nil, fmt.Errorf("the stand-in for %q matches no command of the README: remove it from readmeStandins", c)
		}
	}
	for c := range readmeChecks {
		n := 0
		for _, s := range steps {
			if s.bare == c {
				n++
			}
		}
		if n != 1 {
			return nil, nil, fmt.Errorf("the check of %q matches %d commands of the README, want 1: update readmeChecks", c, n)
		}
	}
	return steps, notRun, nil
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// The session's output marks where each step begins with this byte and the
// step's number on a line of its own; "end" marks the session's end, "log"
// the daemon's log after a failure.
const readmeMark = "\x1e"

// sessionScript is the shell session of the steps, each preceded by its
// mark. It is stricter than an interactive shell: set -e stops it at the
// first command that fails, -o pipefail also when that command is the
// producer of a pipe, and -u at a variable that no earlier command set.
func sessionScript(steps []readmeStep) string {
	var sb strings.Builder
	sb.WriteString("# The README's code blocks, in order (generated by TestReadme).\nset -euo pipefail\n")
	for i, s := range steps {
		fmt.Fprintf(&sb, "printf '%s%d\\n'\n%s\n", readmeMark, i, s.run)
	}
	fmt.Fprintf(&sb, "printf '%send\\n'\n", readmeMark)
	return sb.String()
}

// readmeNamespace runs as root in the test's private mount, network and
// PID namespaces ($1 the work directory, $2 the stockade binary to put on
// PATH, $3 the data directory holding the built images), so that the
// README's commands run as written, on their defaults, without touching
// the host's daemon or data:
//
//   - 127.0.0.1:8700 is the namespace's own loopback, and nftables and
//     sandbox networks are the namespace's;
//   - /var/lib/stockade is a fresh directory with the host's images in it,
//     under an overlay whose upper layer is the test's: the README's
//     template builds write there, never into the host's images;
//   - /run is a fresh tmpfs (the state directory /run/stockade, /run/netns,
//     which the daemon cleans of stale sandbox networks, and the default
//     Docker socket, which it would reap), but for /run/stockade/hostids,
//     the host's, so that no sandbox of the test gets the host ids of one
//     running outside it;
//   - /tmp, the home /root and /var/log (the daemon's log) are fresh, so
//     that no file left by an earlier run stands in for one the README
//     forgot to make, and no dotfile changes what curl prints;
//   - /usr/local is read-only: stockade setup finds runsc there and
//     changes nothing.
//
// The mount points /run/stockade/hostids and /var/lib/stockade are made on
// the host if missing, empty, as any stockade run would. When the session
// ends the daemon is stopped with SIGTERM; whatever is left dies with the
// PID namespace, also when the test is killed (unshare --kill-child).
const readmeNamespace = `set -euo pipefail
work=$1 bin=$2 images=$3/images
ip link set lo up
mkdir -p "$work/images-upper" "$work/images-work"
chmod 0711 "$work/images-upper"
mount -t overlay overlay -o "lowerdir=$images,upperdir=$work/images-upper,workdir=$work/images-work" "$work/data/images"
mount --bind "$bin" "$work/bin/stockade"
mkdir -p /run/stockade/hostids /var/lib/stockade
mount --bind /run/stockade/hostids "$work/hostids"
mount --rbind "$work/data" /var/lib/stockade
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/stockade/hostids /run/readme
mount --move "$work/hostids" /run/stockade/hostids
mount --rbind "$work" /run/readme
mount -t tmpfs -o mode=1777 tmpfs /tmp
mount -t tmpfs -o mode=0700 tmpfs /root
mount -t tmpfs -o mode=0755 tmpfs /var/log
mount --bind -o ro /usr/local /usr/local

finish() {
	rc=$?
	if [ -s /run/stockade/serve.pid ]; then
		pid=$(cat /run/stockade/serve.pid)
		kill -TERM "$pid" 2>/dev/null || true
		for _ in $(seq 1 300); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
	fi
	if [ "$rc" -ne 0 ] && [ -s /var/log/stockade.log ]; then
		printf '\036log\n'
		tail -n 40 /var/log/stockade.log
	fi
	exit "$rc"
}
trap finish EXIT
cd /root
env -i PATH=/run/readme/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root \
	bash --noprofile --norc /run/readme/session.sh
`

// readmeOutput is the session's output, cut at its marks.
type readmeOutput struct {
	before string         // before the first step: the namespace's set-up
	steps  map[int]string // each step's output
	last   int            // the last step that began, or -1
	ended  bool           // every step ran
	log    string         // the daemon's log, after a failure
}

func parseReadmeOutput(out string) readmeOutput {
	parts := strings.Split(out, readmeMark)
	o := readmeOutput{before: parts[0], steps: map[int]string{}, last: -1}
	for _, p := range parts[1:] {
		head, rest, _ := strings.Cut(p, "\n")
		switch n, err := strconv.Atoi(head); {
		case err == nil:
			o.steps[n], o.last = rest, n
		case head == "end":
			o.ended = true
		case head == "log":
			o.log = rest
		}
	}
	return o
}

// transcript renders the session as a terminal would show it, each
// command after a prompt.
func (o readmeOutput) transcript(steps []readmeStep) string {
	var sb strings.Builder
	sb.WriteString(o.before)
	for i := range steps {
		out, ok := o.steps[i]
		if !ok {
			break
		}
		fmt.Fprintf(&sb, "$ %s\n%s", steps[i].shown, out)
	}
	return sb.String()
}

// TestReadme runs the README's code blocks, in order, as one shell
// session from a fresh environment (env -i with PATH and HOME), as a
// newcomer would after a fresh clone and `make up`: its commands as
// written, on their defaults, against a fresh data directory and a daemon
// of its own, in private namespaces (readmeNamespace), with this tree's
// stockade first on PATH. A command that fails stops the session and the
// test names its block and line; what the README says a command prints is
// checked (readmeChecks).
//
// The images are not built: that takes minutes. `make up`'s stand-in runs
// `stockade setup`, which finds the images valid and builds none (the
// same code path a second `make up` takes), and the synopsis that shows
// `stockade image build` is checked by TestReadmeSynopsis. The session
// takes about 10 s: a dozen sandboxes, most of them on gVisor.
func TestReadme(t *testing.T) {
	testenv.RequiresRoot(t)
	for _, bin := range []string{"unshare", "ip", "curl", "runc", "runsc"} {
		testenv.RequiresBinary(t, bin)
	}
	for _, name := range []string{"python", "node", "shell"} {
		testenv.Image(t, name)
	}
	steps, notRun, err := readmeSession(readmeBlocks(t))
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range notRun {
		t.Log(n)
	}

	work := t.TempDir()
	for _, d := range []string{"data/images", "hostids", "bin"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	// Sandboxes in a user namespace traverse the data directory to their
	// image and guest agent.
	if err := os.Chmod(filepath.Join(work, "data"), 0o755); err != nil {
		t.Fatal(err)
	}
	up, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "scripts", "up.sh"))
	if err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"namespace.sh": readmeNamespace, "session.sh": sessionScript(steps), "up.sh": string(up), "bin/stockade": "",
	} {
		if err := os.WriteFile(filepath.Join(work, name), []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "unshare", "--mount", "--net", "--pid", "--fork", "--kill-child", "--mount-proc", "--propagation", "private",
		"bash", filepath.Join(work, "namespace.sh"), work, testenv.Build(t, "./cmd/stockade"), testenv.DataDir())
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	start := time.Now()
	runErr := cmd.Run()
	o := parseReadmeOutput(out.String())
	t.Logf("the session, %d steps in %v:\n%s", len(steps), time.Since(start).Round(time.Millisecond), o.transcript(steps))
	if !o.ended {
		var ee *exec.ExitError
		status := fmt.Sprint(runErr)
		switch {
		case ctx.Err() != nil:
			status = "still running after 5 minutes"
		case errors.As(runErr, &ee):
			status = fmt.Sprintf("exit status %d", ee.ExitCode())
		}
		if o.log != "" {
			t.Logf("the daemon's log ends:\n%s", o.log)
		}
		if o.last < 0 {
			t.Fatalf("the namespace could not be set up (%s):\n%s", status, o.before)
		}
		s := steps[o.last]
		t.Fatalf("%s, line %d: %s: %s, with output:\n%s", s.block, s.line, s.shown, status, o.steps[o.last])
	}
	if runErr != nil {
		t.Fatalf("the session ran every step, then: %v", runErr)
	}
	for i, s := range steps {
		if check, ok := readmeChecks[s.bare]; ok {
			if err := check(o.steps[i]); err != nil {
				t.Errorf("%s, line %d: %s: %v; got:\n%s", s.block, s.line, s.shown, err, o.steps[i])
			}
		}
	}
}

// readmeBlocks returns the code blocks of the README (or of -readme).
func readmeBlocks(t *testing.T) []readmeBlock {
	t.Helper()
	path := *readmeFile
	if path == "" {
		path = filepath.Join(testenv.ModuleRoot(), "README.md")
	}
	text, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks, err := parseReadme(string(text))
	if err != nil {
		t.Fatal(err)
	}
	return blocks
}

// TestReadmeSynopsis checks the commands of the README's synopsis blocks,
// which cannot run as written (their placeholders are in capitals):
// `stockade COMMAND [VERB] --help` exits 0 and lists every flag the
// synopsis gives the command.
func TestReadmeSynopsis(t *testing.T) {
	flagRe := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	verbRe := regexp.MustCompile(`^[a-z][a-z-]*$`)
	n := 0
	for _, b := range readmeBlocks(t) {
		if b.marker != "synopsis" {
			continue
		}
		for _, c := range b.commands() {
			for _, synopsis := range strings.Split(c.bare, " ; ") {
				n++
				t.Run(synopsis, func(t *testing.T) {
					words := strings.Fields(synopsis)
					if words[0] != "stockade" {
						t.Fatalf("%s, line %d: a synopsis of %q, want one of stockade", b, c.line, words[0])
					}
					verbs := 1
					for verbs < len(words) && verbRe.MatchString(words[verbs]) {
						verbs++
					}
					code, out, errOut := runCLI(t, nil, append(words[1:verbs:verbs], "--help")...)
					if code != 0 {
						t.Fatalf("%s, line %d: stockade %s --help: got exit %d, stderr %q; want exit 0", b, c.line, strings.Join(words[1:verbs], " "), code, errOut)
					}
					for _, m := range flagRe.FindAllStringSubmatch(strings.Join(words[verbs:], " "), -1) {
						if !regexp.MustCompile(`(?m)^  -` + m[1] + `(\s|$)`).MatchString(out) {
							t.Errorf("%s, line %d: stockade %s has no flag --%s; its flags:\n%s", b, c.line, strings.Join(words[1:verbs], " "), m[1], out)
						}
					}
				})
			}
		}
	}
	if n == 0 {
		t.Fatal("the README has no synopsis block (<!-- readme-test: synopsis: ... -->)")
	}
}

func TestParseReadme(t *testing.T) {
	const fence = "```"
	for _, tc := range []struct {
		name, text string
		want       []readmeBlock // line, lang, savedAs, marker and section
		commands   []string      // the bare commands of the sh blocks
		err        string        // in the error, if any
	}{{
		name:     "commands",
		text:     "# A\n## B\n" + fence + "sh\n# a comment\nstockade run -c 'x # y' # z\n\ncurl -s \\\n  -d \"#\" a#b\n" + fence + "\n",
		want:     []readmeBlock{{line: 3, lang: "sh", section: "## B"}},
		commands: []string{`stockade run -c 'x # y'`, `curl -s -d "#" a#b`},
	}, {
		name: "data saved",
		text: "Saved as `tools.yaml`:\n\n" + fence + "yaml\ntools: []\n" + fence + "\n" + fence + "text\na listing\n" + fence + "\n",
		want: []readmeBlock{{line: 3, lang: "yaml", savedAs: "tools.yaml", section: "the top"}, {line: 6, lang: "text", section: "the top"}},
	}, {
		name:     "markers",
		text:     "<!-- readme-test: not run: why -->\n" + fence + "yaml\nx: 1\n" + fence + "\n<!-- readme-test: synopsis: why -->\n\n" + fence + "sh\nstockade x NAME\n" + fence + "\n",
		want:     []readmeBlock{{line: 2, lang: "yaml", marker: "not run", section: "the top"}, {line: 7, lang: "sh", marker: "synopsis", section: "the top"}},
		commands: []string{"stockade x NAME"},
	}, {
		name: "data saved nowhere",
		text: "Some text:\n" + fence + "yaml\nx: 1\n" + fence + "\n",
		err:  "is data that is saved nowhere",
	}, {
		name: "no language",
		text: fence + "\nls\n" + fence + "\n",
		err:  "has no language",
	}, {
		name: "not closed",
		text: fence + "sh\nls\n",
		err:  "is not closed",
	}, {
		name: "marker before text",
		text: "<!-- readme-test: not run: why -->\nText.\n" + fence + "sh\nls\n" + fence + "\n",
		err:  "line 1: the readme-test marker is not right before a code block",
	}, {
		name: "marker misspelt",
		text: "<!-- readme-test: skip: why -->\n" + fence + "sh\nls\n" + fence + "\n",
		err:  "is not `<!-- readme-test: not run|synopsis: REASON -->`",
	}, {
		name: "synopsis of data",
		text: "<!-- readme-test: synopsis: why -->\n" + fence + "yaml\nx: 1\n" + fence + "\n",
		err:  "a synopsis is a ```sh block",
	}} {
		t.Run(tc.name, func(t *testing.T) {
			blocks, err := parseReadme(tc.text)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var got []readmeBlock
			var commands []string
			for _, b := range blocks {
				if b.lang == "sh" {
					for _, c := range b.commands() {
						commands = append(commands, c.bare)
					}
				}
				got = append(got, readmeBlock{line: b.line, lang: b.lang, savedAs: b.savedAs, marker: b.marker, section: b.section})
			}
			if fmt.Sprint(got) != fmt.Sprint(tc.want) || strings.Join(commands, "\n") != strings.Join(tc.commands, "\n") {
				t.Errorf("got blocks %+v, commands %q; want %+v, %q", got, commands, tc.want, tc.commands)
			}
		})
	}
}

// TestReadmeSessionNamesWhatItStandsInFor checks that a stand-in or a
// check whose command has left the README fails the test.
func TestReadmeSessionNamesWhatItStandsInFor(t *testing.T) {
	blocks, err := parseReadme("```sh\nmake test\n```\n")
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := readmeSession(blocks); err == nil || !strings.Contains(err.Error(), `the stand-in for "make up" matches no command`) {
		t.Errorf("got %v, want the stand-in of make up named", err)
	}
}
