// Command pause is the test node's Pod sandbox process, as Kubernetes' own pause image
// runs one: it holds the Pod's namespaces, reaps the children it inherits, and ends on
// SIGINT or SIGTERM. With --answer ADDRESS it is also the node tests' backend: it
// accepts TCP connections on ADDRESS and writes its host name (a Pod's name) to each.
// The node's tests write it into a pause image with hack/image (--entrypoint /pause),
// for no image can be pulled on the machines that run them.
package main
