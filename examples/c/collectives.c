/* The C API (shoal/c.h), checked: run under `shoal-run -n N` (N >= 2). Every rank gives
 * rank + 1; each op's result is compared with what it must be, and a bad argument must come back
 * as SHOAL_INVALID_ARGUMENT with a message, on the caller only. */
#include <shoal/c.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call)                                                                  \
  do {                                                                               \
    shoal_result r_ = (call);                                                        \
    if (r_ != SHOAL_SUCCESS) {                                                       \
      fprintf(stderr, "%s failed (%d): %s\n", #call, (int)r_, shoal_last_error());   \
      return 1;                                                                      \
    }                                                                                \
  } while (0)

#define EXPECT(cond)                                      \
  do {                                                    \
    if (!(cond)) {                                        \
      fprintf(stderr, "rank %d: %s is false\n", rank, #cond); \
      return 1;                                           \
    }                                                     \
  } while (0)

int main(void) {
  shoal_comm* comm = NULL;
  CHECK(shoal_comm_create_from_env(60000, &comm));
  const int rank = shoal_comm_rank(comm), size = shoal_comm_size(comm);
  int i, r;

  double x[3] = {rank + 1.0, rank + 1.0, rank + 1.0}, sum[3];
  CHECK(shoal_allreduce(comm, x, sum, 3, SHOAL_F64, SHOAL_SUM));
  for (i = 0; i < 3; ++i) EXPECT(sum[i] == size * (size + 1) / 2.0);

  int32_t b = rank == 1 ? 77 : -1;
  CHECK(shoal_broadcast(comm, &b, 1, SHOAL_I32, 1));
  EXPECT(b == 77);

  int32_t mine = rank + 1, *all = malloc(sizeof(int32_t) * size);
  CHECK(shoal_allgather(comm, &mine, all, 1, SHOAL_I32));
  for (r = 0; r < size; ++r) EXPECT(all[r] == r + 1);

  int32_t mx = 0;
  CHECK(shoal_reduce(comm, &mine, &mx, 1, SHOAL_I32, SHOAL_MAX, 0));
  if (rank == 0) EXPECT(mx == size);

  int32_t *blocks = malloc(sizeof(int32_t) * size), *back = malloc(sizeof(int32_t) * size);
  for (r = 0; r < size; ++r) blocks[r] = 100 * rank + r; /* block r goes to rank r */
  CHECK(shoal_alltoall(comm, blocks, back, 1, SHOAL_I32));
  for (r = 0; r < size; ++r) EXPECT(back[r] == 100 * r + rank);

  int32_t part = -1;
  CHECK(shoal_reduce_scatter(comm, blocks, &part, 1, SHOAL_I32, SHOAL_SUM)); /* sum over ranks of block `rank` */
  EXPECT(part == 100 * size * (size - 1) / 2 + size * rank);

  CHECK(shoal_gather(comm, &mine, back, 1, SHOAL_I32, 0));
  if (rank == 0)
    for (r = 0; r < size; ++r) EXPECT(back[r] == r + 1);
  for (r = 0; r < size; ++r) blocks[r] = rank == 0 ? 7 * r : -1;
  CHECK(shoal_scatter(comm, blocks, &part, 1, SHOAL_I32, 0));
  EXPECT(part == 7 * rank);

  /* rank r sends r + 1 to the next rank */
  int32_t got = -1;
  if (rank % 2 == 0) {
    CHECK(shoal_send(comm, &mine, 1, SHOAL_I32, (rank + 1) % size, 5));
    CHECK(shoal_recv(comm, &got, 1, SHOAL_I32, (rank + size - 1) % size, 5));
  } else {
    CHECK(shoal_recv(comm, &got, 1, SHOAL_I32, (rank + size - 1) % size, 5));
    CHECK(shoal_send(comm, &mine, 1, SHOAL_I32, (rank + 1) % size, 5));
  }
  EXPECT(got == (rank + size - 1) % size + 1);

  /* Bad arguments: an error code and a message on this rank, and the group goes on. */
  EXPECT(shoal_broadcast(comm, &b, 1, SHOAL_I32, size) == SHOAL_INVALID_ARGUMENT);
  EXPECT(strstr(shoal_last_error(), "root") != NULL);
  EXPECT(shoal_allreduce(comm, x, sum, 3, (shoal_dtype)42, SHOAL_SUM) == SHOAL_INVALID_ARGUMENT);
  EXPECT(strstr(shoal_last_error(), "unknown dtype 42") != NULL);
  EXPECT(shoal_barrier(NULL) == SHOAL_INVALID_ARGUMENT);
  CHECK(shoal_barrier(comm));
  EXPECT(strcmp(shoal_last_error(), "") == 0);

  printf("rank %d of %d: C API ok\n", rank, size);
  free(all);
  free(blocks);
  free(back);
  shoal_comm_destroy(comm);
  return 0;
}
