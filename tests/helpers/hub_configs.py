"""Published config.json values (the numbers that matter) that the fit tests, the Models page tests
and the Models page screenshot (packaging/models_screenshot.py) share."""

# Qwen/Qwen2-VL-2B-Instruct config.json (the numbers that matter), as published
QWEN2_VL_2B = {
    "model_type": "qwen2_vl",
    "architectures": ["Qwen2VLForConditionalGeneration"],
    "hidden_size": 1536,
    "intermediate_size": 8960,
    "num_hidden_layers": 28,
    "num_attention_heads": 12,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
    "torch_dtype": "bfloat16",
    "vision_config": {
        "depth": 32,
        "embed_dim": 1280,
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_chans": 3,
        "hidden_size": 1536,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
    },
}
# HuggingFaceTB/SmolVLM-256M-Instruct config.json (Idefics3 layout, SmolLM2-135M + SigLIP-B/16-512)
SMOLVLM_256M = {
    "model_type": "idefics3",
    "architectures": ["Idefics3ForConditionalGeneration"],
    "scale_factor": 4,
    "tie_word_embeddings": False,
    "text_config": {
        "model_type": "llama",
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_hidden_layers": 30,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "head_dim": 64,
        "vocab_size": 49280,
        "tie_word_embeddings": False,
        "max_position_embeddings": 8192,
    },
    "vision_config": {
        "model_type": "idefics3_vision",
        "hidden_size": 768,
        "intermediate_size": 3072,
        "num_hidden_layers": 12,
        "num_attention_heads": 12,
        "patch_size": 16,
        "image_size": 512,
        "num_channels": 3,
    },
}
