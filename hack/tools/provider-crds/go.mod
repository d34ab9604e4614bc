// Pins the infrastructure providers whose CRDs test/templates applies the cluster-template
// overlays in templates/ against (server-side dry run). Only their files are used (CRDs,
// or the API types the CRDs are generated from); nothing here is compiled.
//   - Cluster API Provider vSphere: config/default/crd/bases (VSphereMachineTemplate).
//   - Cluster API Provider Metal3: the root module is not on the module proxy, so its
//     CRDs are generated from the api module's types (Metal3DataTemplate, ...).
//   - Cluster API Provider Proxmox: config/crd/bases. Its ipv4PoolRef/ipv6PoolRef accept
//     only InClusterIPPool and GlobalInClusterIPPool (CEL), so there is no Proxmox
//     template; test/templates checks that this is still so.
module github.com/vitistack/cluster-api-ipam-provider-vitistack/hack/tools/provider-crds

go 1.26

require (
	github.com/ionos-cloud/cluster-api-provider-proxmox v0.7.2
	github.com/metal3-io/cluster-api-provider-metal3/api v1.11.1
	sigs.k8s.io/cluster-api-provider-vsphere v1.14.0
)
