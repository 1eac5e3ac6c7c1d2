"""The HTTP app (TGI and OpenAI routes) over tgix; arrives with the server issue."""
