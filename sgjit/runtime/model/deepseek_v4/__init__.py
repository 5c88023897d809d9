"""DeepSeek-V4 (`DeepseekV4ForCausalLM`): config, paged cache, the decoder and its parts."""
