package ipamapi

import (
	"context"
	"strings"
	"unicode"
)

// Operation names what a request was for, in metrics: register, release, rotate (a
// registration that moves an address to a new secret) or probe (a pool's check of its
// zone, family and subnet).
type Operation string

// The operations of Options.Observe.
const (
	OpRegister Operation = "register"
	OpRelease  Operation = "release"
	OpRotate   Operation = "rotate"
	OpProbe    Operation = "probe"
)

// Operations is every Operation: the values of the operation label of the request
// metrics.
var Operations = []Operation{OpRegister, OpRelease, OpRotate, OpProbe}

type operationKey struct{}

// WithOperation marks the requests sent with ctx as op (OpProbe, say) for
// Options.Observe; without it a request is register, release or rotate by its kind.
func WithOperation(ctx context.Context, op Operation) context.Context {
	return context.WithValue(ctx, operationKey{}, op)
}

// operationOf is what a request sent with ctx is for.
func operationOf(ctx context.Context, method string, req Request) Operation {
	if op, ok := ctx.Value(operationKey{}).(Operation); ok {
		return op
	}
	switch {
	case method != "POST":
		return OpRelease
	case req.NewSecret != "":
		return OpRotate
	}
	return OpRegister
}

// Outcome is the label of a request's outcome in metrics: "success", or the error's
// class in snake case ("wrong_secret", "transient").
func Outcome(err error) string {
	if err == nil {
		return "success"
	}
	c := ClassOf(err)
	if c == "" {
		c = ClassTransient
	}
	return classOutcome(c)
}

// Outcomes is every value Outcome returns: "success", and each of Classes in snake case.
func Outcomes() []string {
	out := []string{Outcome(nil)}
	for _, c := range Classes {
		out = append(out, classOutcome(c))
	}
	return out
}

func classOutcome(c Class) string {
	var b strings.Builder
	for i, r := range string(c) {
		if unicode.IsUpper(r) {
			if i > 0 {
				b.WriteByte('_')
			}
			r = unicode.ToLower(r)
		}
		b.WriteRune(r)
	}
	return b.String()
}
