/* cache/locate.c: cache_locate_here, the public face of fleet_locate's count of this host's
 * leading blocks (the worker's affinity forwarding compares it with the other hosts'). */
#include "cache/cache_internal.h"

int cache_locate_here(cache_t *c, const uint64_t *names, int n, cache_peer_t *out, int max_out,
                      int *here)
{
    return fleet_locate(c, names, n, out, max_out, 0, here);
}
