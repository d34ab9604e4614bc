package localcluster

import (
	"context"
	"errors"
	"testing"
)

// A wait that ended before its condition saw an error (the context ended first) still
// reports a failure: the wait's own error, never nil.
func TestWaitErrorNeverHidesAFailedWait(t *testing.T) {
	seen := errors.New("2 of 3 replicas Ready")
	for _, c := range []struct {
		last, waited, want error
	}{
		{nil, nil, nil},
		{seen, nil, nil},
		{seen, context.DeadlineExceeded, seen},
		{nil, context.Canceled, context.Canceled},
	} {
		if got := WaitError(c.last, c.waited); !errors.Is(got, c.want) || (c.want == nil) != (got == nil) {
			t.Errorf("WaitError(%v, %v) = %v, want %v", c.last, c.waited, got, c.want)
		}
	}
}
