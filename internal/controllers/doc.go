// Package controllers holds one package per controller — claim (IPAddressClaims
// of Vitistack pools), pool (status), service (LoadBalancer Services) and
// secret (the Secret protector) — which share internal/registrar and never import each
// other (make verify-imports). Its own tests are the envtest suite of all of them
// together, wired as the manager wires them.
package controllers
