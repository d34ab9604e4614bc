package localcluster

import (
	"context"
	"errors"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
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

// A Deployment is rolled out only when its controller saw its current generation and every
// replica it asks for runs the current template and is Ready: an old Pod that is still
// Ready while the new one starts (an upgrade) is not it.
func TestRolledOut(t *testing.T) {
	two := int32(2)
	for _, c := range []struct {
		name   string
		d      appsv1.Deployment
		rolled bool
	}{
		{"rolled out", deployment(nil, 3, appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1}), true},
		{"two replicas", deployment(&two, 1, appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 2}), true},
		{"its change not seen yet", deployment(nil, 4, appsv1.DeploymentStatus{ObservedGeneration: 3, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 1}), false},
		{"the old Pod Ready, the new one starting", deployment(nil, 4, appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 2, UpdatedReplicas: 1, ReadyReplicas: 1}), false},
		{"the new Pod not Ready", deployment(nil, 4, appsv1.DeploymentStatus{ObservedGeneration: 4, Replicas: 1, UpdatedReplicas: 1, ReadyReplicas: 0}), false},
		{"one of two Ready", deployment(&two, 1, appsv1.DeploymentStatus{ObservedGeneration: 1, Replicas: 2, UpdatedReplicas: 2, ReadyReplicas: 1}), false},
	} {
		if err := RolledOut(&c.d); (err == nil) != c.rolled {
			t.Errorf("%s: RolledOut says %v", c.name, err)
		}
	}
}

func deployment(replicas *int32, generation int64, status appsv1.DeploymentStatus) appsv1.Deployment {
	d := appsv1.Deployment{Status: status}
	d.Generation, d.Spec.Replicas = generation, replicas
	return d
}
