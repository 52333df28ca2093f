/* TCP bootstrap of a group in pods: rank 0 serves a small blob (the NCCL
 * unique id, 128 bytes) and every other rank fetches it. Plain sockets, no MPI.
 *
 * The blob is tagged with a run id and a restart attempt number: a client
 * whose tag, world size or blob size differs from the server's is refused, so
 * a restarted group (attempt + 1) never takes the id of the previous attempt,
 * and a client of an old attempt never joins a new group. A refused client
 * keeps retrying until its deadline (the right server may come up later),
 * then fails with the last refusal in its message.
 *
 * Clients retry with exponential backoff (0.1 s doubling to backoff_max_s)
 * until timeout_s has passed: connection refused, an unresolvable name (a
 * headless Service's DNS record appears only when the pod is ready) and a
 * silent server all count as "not up yet". Rank 0 returns once every rank
 * 1..world-1 has fetched the blob and acknowledged it, or fails after
 * timeout_s naming the ranks that never came.
 *
 * Wire format (integers big-endian):
 *   client: "RFB1" u32 attempt, u32 rank, u32 world, u32 blob_len,
 *           u16 run_id_len, run_id bytes
 *   server: "RFB1" u8 status (0 ok, 1 refused), u32 n, n bytes (the blob,
 *           or the reason of the refusal)
 *   client: "ACK1" once it holds the blob. */
#ifndef RF_COMM_BOOTSTRAP_H
#define RF_COMM_BOOTSTRAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define RF_BOOT_MAX_BLOB   4096
#define RF_BOOT_MAX_RUN_ID 127

typedef struct rf_boot_opts {
    const char *run_id;   /* tag (NULL: "default"), at most RF_BOOT_MAX_RUN_ID bytes */
    uint32_t attempt;     /* restart attempt of the group */
    int rank, world;      /* this process; 0 <= rank < world */
    double timeout_s;     /* whole exchange; <= 0: 900 */
    double io_timeout_s;  /* one connection's send/receive; <= 0: 5 */
    double backoff_max_s; /* client retry interval cap; <= 0: 2 */
} rf_boot_opts;

typedef struct rf_boot_server rf_boot_server;

/* Rank 0: listens on bind_addr (NULL: every address) and port (0: a free
 * port, see rf_boot_server_port). */
int rf_boot_listen(const char *bind_addr, int port, rf_boot_server **out);
int rf_boot_server_port(const rf_boot_server *s);
/* Serves blob until ranks 1..world-1 have all acknowledged it; RF_ERR_IO
 * ("timeout: ...") after o->timeout_s. len <= RF_BOOT_MAX_BLOB. */
int rf_boot_serve(rf_boot_server *s, const rf_boot_opts *o, const void *blob, size_t len);
void rf_boot_server_close(rf_boot_server *s); /* NULL is a no-op */

/* Ranks 1..world-1: fetches exactly len bytes from rank 0 at host:port;
 * RF_ERR_IO ("timeout: ...", with the last error seen) after o->timeout_s. */
int rf_boot_fetch(const char *host, int port, const rf_boot_opts *o, void *blob, size_t len);

#ifdef __cplusplus
}
#endif

#endif
