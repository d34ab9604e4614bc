package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// Row is one line of the summary: a scenario, what its faults did (Detail: each
// phase's own count), and what the accounting oracle and the canary scan found after
// it. A scenario that failed is recorded too (Failed), with what they found last.
type Row struct {
	Scenario                        string
	Detail                          string `json:",omitempty"`
	Failed                          bool   `json:",omitempty"`
	Claims, Services, Kills, Faults int
	Duration                        time.Duration
	Leaked, Duplicated, Orphaned    int
	Mismatched                      int
	Stuck                           int
	Protections                     int
	Canaries                        int
}

// Zero reports whether the scenario ended with nothing wrong.
func (r Row) Zero() bool {
	return !r.Failed && r.Leaked+r.Duplicated+r.Orphaned+r.Mismatched+r.Stuck+r.Protections+r.Canaries == 0
}

// SetAccounts takes the counts of what the accounting oracle found.
func (r *Row) SetAccounts(a Accounts) {
	r.Leaked, r.Duplicated, r.Orphaned = len(a.Leaked), len(a.Duplicated), len(a.Orphaned)
	r.Mismatched, r.Stuck, r.Protections = len(a.Mismatched), len(a.Stuck), len(a.Protections)
}

var (
	mu   sync.Mutex
	rows []Row
)

// Full reports whether the scenarios run at full size (make test-chaos: E2E_CHAOS=full)
// rather than the short version make test runs.
func Full() bool { return os.Getenv("E2E_CHAOS") == "full" }

// Record keeps a row for the summary, and appends it to the CHAOS_ROWS file if set.
func Record(r Row) error {
	mu.Lock()
	defer mu.Unlock()
	rows = append(rows, r)
	file := os.Getenv("CHAOS_ROWS")
	if file == "" {
		return nil
	}
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(file), 0o750); err != nil { //nolint:gosec // a path the make target names
		return err
	}
	f, err := os.OpenFile(file, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600) //nolint:gosec // a path the make target names
	if err != nil {
		return err
	}
	if _, err := f.Write(append(b, '\n')); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// RecordAtEnd records row when t ends, passed or failed, with the scenario's duration
// from now: a failed scenario's row is marked Failed and carries what account finds
// then, so that the table shows every scenario that ran.
func RecordAtEnd(t testing.TB, row *Row, account func() (Accounts, error)) {
	start := time.Now()
	t.Cleanup(func() {
		row.Duration = time.Since(start)
		if t.Failed() {
			row.Failed = true
			a, err := account()
			if err != nil {
				t.Errorf("the accounting oracle, after the scenario failed: %v", err)
				row.Detail = strings.TrimPrefix(row.Detail+"; not accounted: "+err.Error(), "; ")
			} else {
				row.SetAccounts(a)
			}
		}
		if err := Record(*row); err != nil {
			t.Error(err)
		}
	})
}

// Rows returns the rows of the CHAOS_ROWS file if set (every suite's), else the rows
// this process recorded.
func Rows() ([]Row, error) {
	mu.Lock()
	defer mu.Unlock()
	file := os.Getenv("CHAOS_ROWS")
	if file == "" {
		return append([]Row(nil), rows...), nil
	}
	f, err := os.Open(file) //nolint:gosec // a path the make target names
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	var out []Row
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var r Row
		if err := json.Unmarshal(sc.Bytes(), &r); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		out = append(out, r)
	}
	return out, sc.Err()
}

// Commit is the commit the scenarios run on, as CHAOS_COMMIT names it (make test-chaos
// sets it from git, with "-dirty" for uncommitted changes), or "unknown".
func Commit() string {
	if c := os.Getenv("CHAOS_COMMIT"); c != "" {
		return c
	}
	return "unknown"
}

// Table renders rows as the Markdown summary, headed with the size, the commit and the
// time. Every recorded scenario has a row, a failed one marked FAILED.
func Table(rows []Row, now time.Time) string {
	size := "short (make test)"
	if Full() {
		size = "full (make test-chaos)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Chaos scenarios, %s size, commit %s, %s\n\n", size, Commit(), now.UTC().Format("2006-01-02 15:04 MST"))
	b.WriteString("| scenario | result | claims | Services | kills / restarts | faults injected | duration | leaked | duplicated | orphaned | mismatched | stuck | Secret protections | canaries found |\n")
	b.WriteString("|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		scenario, result := r.Scenario, "passed"
		if r.Detail != "" {
			scenario += " (" + r.Detail + ")"
		}
		if !r.Zero() {
			result = "**FAILED**"
		}
		fmt.Fprintf(&b, "| %s | %s | %d | %d | %d | %d | %s | %d | %d | %d | %d | %d | %d | %d |\n", scenario, result, r.Claims, r.Services, r.Kills, r.Faults,
			r.Duration.Round(time.Second), r.Leaked, r.Duplicated, r.Orphaned, r.Mismatched, r.Stuck, r.Protections, r.Canaries)
	}
	return b.String()
}
