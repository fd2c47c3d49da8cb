# Kaldi data dirs: wav.scp (path or "cmd |"), text, utt2spk (+ optional segments, utt2dur)
python tools/validate_data_dir.py data/train
asrkit train-tokenizer --text data/train/text --model-type char data/lang/tokenizer.json
asrkit compute-cmvn --config conf/tiny_ctc.yaml data/train data/lang/cmvn.json
asrkit train --config conf/tiny_ctc.yaml --train-data data/train --valid-data data/dev \
    --tokenizer data/lang/tokenizer.json --cmvn data/lang/cmvn.json --out exp/tiny_ctc
asrkit decode --model exp/tiny_ctc --data data/test --out exp/tiny_ctc/decode_test
asrkit score --ref data/test/text --hyp exp/tiny_ctc/decode_test/text --utt2spk data/test/utt2spk
asrkit transcribe --model exp/tiny_ctc some.wav other.flac recordings/ --format srt --output-dir subs/
# a language model, and CTC prefix beam search with the LM fused
asrkit train-lm --config conf/lm_lstm_small.yaml --text data/train/text --dev-text data/dev/text \
    --tokenizer data/lang/tokenizer.json --out exp/lm_lstm
asrkit decode --model exp/tiny_ctc --data data/test --out exp/tiny_ctc/decode_test_lm \
    --decode-config conf/decode_ctc_prefix_lm.yaml --lm exp/lm_lstm --lm-weight 0.8 --set length_bonus=2.5
