// Package registrartest helps tests of the registrar's users: it runs a registrar.Queue
// into a work queue of the test's own and reads what was put into it. Test code only.
package registrartest
