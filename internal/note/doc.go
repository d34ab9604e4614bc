// Package note keeps what the provider tells users within the API server's limits: an
// event's note (1 KiB: a longer one is refused, and the event is lost) and the part of a
// condition's message that another component wrote. It holds no state and no client.
package note
