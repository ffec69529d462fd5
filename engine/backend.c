/* engine/backend.c: what every backend shares (engine/backend.h). */
#include "backend.h"

#include <stdio.h>

int backend_check_batch(const backend_t *be, const backend_batch_t *b, int max_tokens,
                        char *errstr, size_t errlen)
{
    const char *who = be->ops->name;
    const hparams_t *hp = &be->model->hp;
    const int B = be->params.block_tokens;
    if (b->n_tokens <= 0 || b->n_tokens > max_tokens || b->n_logits < 0 ||
        b->n_logits > b->n_tokens) {
        snprintf(errstr, errlen, "%s: batch of %d tokens / %d logits (limit %d)", who,
                 b->n_tokens, b->n_logits, max_tokens);
        return -1;
    }
    if (b->n_seqs <= 0 || b->n_seqs > b->n_tokens || b->seq_start[0] != 0 ||
        b->seq_start[b->n_seqs] != b->n_tokens) {
        snprintf(errstr, errlen, "%s: bad sequence ranges", who);
        return -1;
    }
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->seq_start[s + 1] <= b->seq_start[s]) {
            snprintf(errstr, errlen, "%s: sequence %d has no tokens", who, s);
            return -1;
        }
        for (int t = b->seq_start[s]; t < b->seq_start[s + 1]; t++) {
            if (b->tokens[t] < 0 || b->tokens[t] >= hp->n_vocab) {
                snprintf(errstr, errlen, "%s: token id %d out of range [0, %d)", who,
                         b->tokens[t], hp->n_vocab);
                return -1;
            }
            if (b->pos[t] < 0 || b->pos[t] >= hp->ctx_len ||
                (t > b->seq_start[s] && b->pos[t] != b->pos[t - 1] + 1)) {
                snprintf(errstr, errlen, "%s: bad position %d of sequence %d", who, b->pos[t], s);
                return -1;
            }
        }
        int last = b->pos[b->seq_start[s + 1] - 1];
        /* with a sliding window on every layer, blocks wholly before the first key of the
         * sequence's first token are not read and may be -1 (released) */
        int win = model_kv_window(be->model), first = b->pos[b->seq_start[s]] - win + 1;
        int skip = win > 0 && first > 0 ? first / B : 0;
        for (int i = 0; i <= last / B; i++) {
            int32_t blk = b->block_tables[s][i];
            if (i < skip && blk == -1) continue;
            if (blk < 0 || blk >= be->params.n_kv_blocks) {
                snprintf(errstr, errlen, "%s: sequence %d block %d = %d out of range", who, s, i,
                         blk);
                return -1;
            }
        }
    }
    for (int i = 0; i < b->n_logits; i++)
        if (b->logits_idx[i] < 0 || b->logits_idx[i] >= b->n_tokens) {
            snprintf(errstr, errlen, "%s: logits index %d out of range", who, b->logits_idx[i]);
            return -1;
        }
    return 0;
}
