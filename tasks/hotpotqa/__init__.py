"""HotpotQA multi-hop question answering, distractor setting."""
