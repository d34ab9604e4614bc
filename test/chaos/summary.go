package chaos

import (
	"bufio"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// Row is one line of the summary: a scenario and what the accounting found after it.
type Row struct {
	Scenario                            string
	Claims, Services, Kills, Faults     int
	Duration                            time.Duration
	Leaked, Duplicated, Orphaned, Stuck int
	Canaries                            int
}

// Zero reports whether the scenario ended with nothing wrong.
func (r Row) Zero() bool { return r.Leaked+r.Duplicated+r.Orphaned+r.Stuck+r.Canaries == 0 }

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

// Table renders rows as the Markdown summary, headed with the size and the time.
func Table(rows []Row, now time.Time) string {
	size := "short (make test)"
	if Full() {
		size = "full (make test-chaos)"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Chaos scenarios, %s size, %s\n\n", size, now.UTC().Format("2006-01-02 15:04 MST"))
	b.WriteString("| scenario | claims | Services | kills / restarts | faults injected | duration | leaked | duplicated | orphaned | stuck | canaries found |\n")
	b.WriteString("|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|\n")
	for _, r := range rows {
		fmt.Fprintf(&b, "| %s | %d | %d | %d | %d | %s | %d | %d | %d | %d | %d |\n", r.Scenario, r.Claims, r.Services, r.Kills, r.Faults,
			r.Duration.Round(time.Second), r.Leaked, r.Duplicated, r.Orphaned, r.Stuck, r.Canaries)
	}
	return b.String()
}
