/* putget_mpi: the MPI one-sided peer of `rackmem bench transfer`. Two ranks; rank 0 puts to and
 * gets from a window of rank 1 with passive target synchronisation (one MPI_Win_lock for the
 * whole run, MPI_Win_flush after each operation, so each is complete when timed, as
 * rackmem_put and rackmem_get are), rank 1 does nothing but wait.
 *
 * usage: mpirun -n 2 putget_mpi ROUNDS SIZE...
 * prints, for each size and round: "put SIZE NS" and "get SIZE NS" (mean ns per operation). */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

/* Operations per measurement: enough to last a few milliseconds, at least 3. */
static long reps_for(long bytes) {
    long r = (32L << 20) / (bytes > 0 ? bytes : 1);
    return r < 3 ? 3 : r > 500 ? 500 : r;
}

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    if (n != 2 || argc < 3) {
        if (rank == 0) fprintf(stderr, "usage: mpirun -n 2 putget_mpi ROUNDS SIZE...\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    int rounds = atoi(argv[1]);
    long max = 0;
    for (int i = 2; i < argc; i++) if (atol(argv[i]) > max) max = atol(argv[i]);
    void *base;
    MPI_Win win;
    MPI_Win_allocate((MPI_Aint)max, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &base, &win);
    char *buf = malloc((size_t)max);
    if (!buf) MPI_Abort(MPI_COMM_WORLD, 3);
    memset(buf, 7, (size_t)max);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_SHARED, 1, 0, win);
        for (int i = 2; i < argc; i++) {
            long bytes = atol(argv[i]), reps = reps_for(bytes);
            for (int r = 0; r < rounds; r++) {
                double t = now_ns();
                for (long k = 0; k < reps; k++) {
                    MPI_Put(buf, (int)bytes, MPI_BYTE, 1, 0, (int)bytes, MPI_BYTE, win);
                    MPI_Win_flush(1, win);
                }
                printf("put %ld %.0f\n", bytes, (now_ns() - t) / (double)reps);
                t = now_ns();
                for (long k = 0; k < reps; k++) {
                    MPI_Get(buf, (int)bytes, MPI_BYTE, 1, 0, (int)bytes, MPI_BYTE, win);
                    MPI_Win_flush(1, win);
                }
                printf("get %ld %.0f\n", bytes, (now_ns() - t) / (double)reps);
            }
        }
        MPI_Win_unlock(1, win);
        fflush(stdout);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    MPI_Win_free(&win);
    free(buf);
    MPI_Finalize();
    return 0;
}
