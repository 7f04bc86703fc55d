// spm.cpp — extern "C" shim over libsentencepiece: load, piece table, encode with byte offsets.
// Everything else (specials in text, decode, streaming, config files) is C in tokenizer.c; this
// file deliberately exposes no C++ type to the rest of the project.
#include "tokenizer/tok_internal.h"
#include <sentencepiece_processor.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <string>
#include <vector>

struct SpmModel {
    sentencepiece::SentencePieceProcessor sp;
    std::vector<int> ids; // scratch
};

extern "C" SpmModel *spm_load(const char *path, char *err, size_t errlen) {
    std::ifstream f(path, std::ios::binary);
    if (!f) {
        snprintf(err, errlen, "%s: cannot open SentencePiece model", path);
        return nullptr;
    }
    std::string bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    SpmModel *m = new (std::nothrow) SpmModel();
    if (!m) {
        snprintf(err, errlen, "%s: out of memory", path);
        return nullptr;
    }
    auto st = m->sp.LoadFromSerializedProto(bytes);
    if (!st.ok() || m->sp.GetPieceSize() <= 0) {
        snprintf(err, errlen, "%s: not a valid SentencePiece model (%s)", path,
                 st.ok() ? "empty vocabulary" : st.ToString().c_str());
        delete m;
        return nullptr;
    }
    return m;
}

extern "C" void spm_free(SpmModel *m) { delete m; }
extern "C" int spm_vocab_size(const SpmModel *m) { return m->sp.GetPieceSize(); }
extern "C" int spm_piece_type(const SpmModel *m, int id) {
    if (m->sp.IsControl(id)) return 1;
    if (m->sp.IsUnknown(id)) return 2;
    if (m->sp.IsByte(id)) return 3;
    if (m->sp.IsUnused(id)) return 4;
    return 0;
}
// IdToPiece returns a reference into the model, which lives as long as m: no copy needed.
extern "C" const char *spm_piece(const SpmModel *m, int id) { return m->sp.IdToPiece(id).c_str(); }
extern "C" int spm_bos_id(const SpmModel *m) { return m->sp.bos_id(); }
extern "C" int spm_eos_id(const SpmModel *m) { return m->sp.eos_id(); }
extern "C" int spm_pad_id(const SpmModel *m) { return m->sp.pad_id(); }

extern "C" void spm_encode_chunk(SpmModel *m, const char *text, size_t len, size_t base,
                                 TokIds *out, TokIds *starts) {
    absl::string_view in(text, len);
    if (!starts) {
        m->ids.clear();
        auto st = m->sp.Encode(in, &m->ids);
        if (!st.ok()) return; // only fails on a model that did not load
        for (int id : m->ids) tok_ids_push(out, id);
        return;
    }
    sentencepiece::ImmutableSentencePieceText spt = m->sp.EncodeAsImmutableProto(in);
    size_t np = spt.pieces_size();
    for (size_t i = 0; i < np; i++) {
        auto p = spt.pieces((int)i);
        tok_ids_push(out, (int32_t)p.id());
        tok_ids_push(starts, (int32_t)(base + p.begin()));
    }
}
